"""parallel.select_devices: which devices `parallel.num_devices` puts in the mesh."""

from typing import NamedTuple

import jax
import pytest

from rljax.parallel import make_mesh, select_devices


class FakeDevice(NamedTuple):
  id: int
  process_index: int


def _devices(process_of_each):
  return [FakeDevice(i, p) for i, p in enumerate(process_of_each)]


def test_one_process_takes_a_prefix_and_zero_means_all():
  devices = _devices([0] * 8)
  assert select_devices(3, devices) == devices[:3]
  assert select_devices(0, devices) == devices
  assert select_devices(8, devices) == devices


@pytest.mark.parametrize("order", [[0, 0, 0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 0, 1, 0, 1]])
def test_several_processes_each_contribute_equally(order):
  """A prefix of the global list would be process 0's devices only (first order)."""
  devices = _devices(order)
  chosen = select_devices(4, devices)
  assert [d.process_index for d in chosen] == [0, 0, 1, 1]
  for p in (0, 1):   # each process's own first devices, in their order
    assert [d for d in chosen if d.process_index == p] == [d for d in devices
                                                         if d.process_index == p][:2]


@pytest.mark.parametrize("wanted,match", [(3, "multiple of the 2 processes"),
                                          (9, r"must be in \[0, 8\]"),
                                          (-1, r"must be in \[0, 8\]")])
def test_bad_counts_name_the_field(wanted, match):
  with pytest.raises(ValueError, match=match) as info:
    select_devices(wanted, _devices([0, 0, 0, 0, 1, 1, 1, 1]))
  assert "parallel.num_devices" in str(info.value)


def test_uneven_processes_are_refused():
  with pytest.raises(ValueError, match="at most 2 x 1"):
    select_devices(4, _devices([0, 0, 0, 1]))


def test_mesh_over_the_selected_real_devices():
  mesh = make_mesh(data=-1, devices=select_devices(4))
  assert mesh.devices.size == 4
  assert list(mesh.devices.flat) == jax.devices()[:4]
