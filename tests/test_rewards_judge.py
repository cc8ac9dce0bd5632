"""Generative reward hook: stub judges, a local HTTP judge, and how failures are reported."""

import http.server
import json
import threading
import time

import pytest

from rljax.data import Prompt
from rljax.rewards import compose
from rljax.rewards.judge import JudgeError, JudgeReward, http_judge, parse_score

PROMPT = Prompt(id="p0", text="Q:3+5\n", answer="8", difficulty=1)


@pytest.mark.parametrize("output, expected", [
    (7, 7.0), (0.25, 0.25), (" -3.5 ", -3.5), ("Score: 8", 8.0), ("score=2.5", 2.5),
    ("first Score: 1, on reflection Score: 9", 9.0), ("<score>4</score>", 4.0),
])
def test_parse_score_golden(output, expected):
  assert parse_score(output) == expected


@pytest.mark.parametrize("output", ["looks good to me", True, None, float("nan"), "inf", [1]])
def test_parse_score_rejects_garbage(output):
  with pytest.raises(ValueError):
    parse_score(output)


def test_stub_judge_gets_question_completion_reference():
  seen = []

  def judge(prompt_text, completion, reference):
    seen.append((prompt_text, completion, reference))
    ok = reference is not None and completion.endswith(reference)
    return f"reasoning... Score: {10 if ok else 0}"

  reward = JudgeReward(judge, timeout=5.0)
  assert reward(PROMPT, "3+5=8\n8") == 10.0
  assert reward(PROMPT, "3+5=9\n9") == 0.0
  assert reward("plain text prompt", "x8") == 0.0  # a str prompt has no reference
  assert seen[0] == ("Q:3+5\n", "3+5=8\n8", "8") and seen[2] == ("plain text prompt", "x8", None)


def test_stub_judge_inside_compose_is_weighted_and_logged():
  reward = JudgeReward(lambda p, c, r: float(len(c)), timeout=None)
  out = compose([("judge", reward, 0.5), ("const", lambda p, c: 1.0, 1.0)])([PROMPT] * 2,
                                                                           ["ab", "abcd"])
  assert out.components["judge"].tolist() == [2.0, 4.0]
  assert out.total.tolist() == [2.0, 3.0]
  assert out.failures == []


def test_garbage_is_retried_then_reported():
  outputs = iter(["no idea", "Score: 6"])
  reward = JudgeReward(lambda p, c, r: next(outputs), retries=1, timeout=None)
  assert reward(PROMPT, "x") == 6.0 and reward.calls == 2 and reward.failures == 1

  always_bad = JudgeReward(lambda p, c, r: "I refuse", retries=2, timeout=None)
  with pytest.raises(JudgeError, match=r"prompt 'p0' after 3 attempt\(s\).*no score found"):
    always_bad(PROMPT, "x")
  out_of_range = JudgeReward(lambda p, c, r: 11, bounds=(0, 10), timeout=None)
  with pytest.raises(JudgeError, match="outside bounds"):
    out_of_range(PROMPT, "x")


def test_hanging_judge_times_out_and_compose_contains_it():
  release, returned = threading.Event(), threading.Event()

  def hanging(prompt_text, completion, reference):
    release.wait(10.0)  # bounded; released at the end of the test
    returned.set()
    return 1.0

  reward = JudgeReward(hanging, timeout=0.2)
  out = compose([("judge", reward, 1.0)], timeout=None)([PROMPT], ["x"])
  assert not returned.is_set()   # compose came back while the judge still hung
  release.set()
  (failure,) = out.failures
  assert failure.component == "judge" and failure.kind == "exception"
  assert "JudgeError" in failure.message and "timed out after 0.2 s" in failure.message
  assert out.failure_counts == {"judge": 1} and out.total.tolist() == [0.0]


class _Handler(http.server.BaseHTTPRequestHandler):
  def do_POST(self):  # noqa: N802  (http.server API)
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    if self.path == "/score":
      reply, status = {"score": float(body["completion"] == body["reference"]) * 10}, 200
    elif self.path == "/text":
      reply, status = {"score": f"{body['prompt'][:20]} ... Score: 7"}, 200
    elif self.path == "/garbage":
      reply, status = "<html>not a score</html>", 200
    elif self.path == "/slow":
      time.sleep(1.0)
      reply, status = {"score": 1}, 200
    else:
      reply, status = {"error": "no such judge"}, 500
    data = (reply if isinstance(reply, str) else json.dumps(reply)).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
    except (BrokenPipeError, ConnectionResetError):  # /slow: the client gave up already
      pass

  def log_message(self, *args):
    pass


@pytest.fixture
def judge_url(monkeypatch):
  monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
  monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  server.daemon_threads = True
  thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                            daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{server.server_address[1]}"
  server.shutdown()
  server.server_close()
  thread.join(timeout=5.0)


def test_http_judge_scores_through_local_server(judge_url):
  reward = JudgeReward(http_judge(judge_url + "/score", timeout=5.0), timeout=10.0)
  assert reward(PROMPT, "8") == 10.0
  assert reward(PROMPT, "9") == 0.0
  text = JudgeReward(http_judge(judge_url + "/text", template="Q={prompt} A={completion}"))
  assert text(PROMPT, "8") == 7.0


def test_http_judge_failures_are_named(judge_url):
  with pytest.raises(JudgeError, match="HTTP 500"):
    JudgeReward(http_judge(judge_url + "/missing", timeout=5.0))(PROMPT, "8")
  with pytest.raises(JudgeError, match="no score found in judge output '<html>"):
    JudgeReward(http_judge(judge_url + "/garbage", timeout=5.0))(PROMPT, "8")
  with pytest.raises(JudgeError, match="unreachable or timed out"):   # /slow answers after 1 s
    JudgeReward(http_judge(judge_url + "/slow", timeout=0.2))(PROMPT, "8")
  out = compose([("judge", JudgeReward(http_judge(judge_url + "/missing", timeout=5.0)), 1.0)])(
      [PROMPT], ["8"])
  assert out.failure_counts == {"judge": 1} and "HTTP 500" in out.failures[0].message
