"""TPU slice names -> physical topologies and chip figures; compile-only devices for them.

Google Cloud names a slice by its accelerator type: `v4-N` and `v5p-N` count TensorCores
(two per chip), `v5litepod-N` (here also `v5e-N`) and `v6e-N` count chips. libtpu names the
same slice by its chip grid, `v5p:4x4x4` (also accepted here), and builds compile-only
devices for it (`jax.experimental.topologies.get_topology_desc`): `jit(...).lower(...)
.compile()` on a mesh of them runs the TPU compiler on this host, whatever it is. `local`
is the host's own devices (a GPU machine, or a TPU VM).

Chip figures (peak dense bf16 FLOP/s, HBM bytes and bandwidth per chip) are the ones the
Google Cloud page of each TPU version publishes (`ChipSpec.source`). The HBM the compiler
lets a program use is a little less than the nominal capacity on some versions; `usable_hbm`
is what libtpu 0.0.42.1 reports as available when a program does not fit
("exceeds available HBM (X)"), and a plan checks against the smaller of the two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import math
import os
import re
import tempfile

import jax
from jax.experimental import topologies

GIB = 2 ** 30
INSTALL_HINT = 'pip install -e ".[tpu]"   (libtpu matching the pinned jax; compile only, no TPU needed)'


@dataclasses.dataclass(frozen=True)
class ChipSpec:
  """One TPU version's per-chip figures (devices are chips: v4 and v5p as megacores)."""

  name: str
  peak_flops: float        # dense bf16 FLOP/s per chip
  hbm_bytes: float         # published HBM capacity per chip
  usable_hbm: float        # HBM the TPU compiler reports as available to a program
  hbm_bandwidth: float     # bytes/s per chip
  source: str              # the page the three published figures come from

  @property
  def hbm_limit(self) -> float:
    """The capacity a plan checks against: the smaller of published and usable."""
    return min(self.hbm_bytes, self.usable_hbm)


CHIPS = {
    "v4": ChipSpec("v4", 275e12, 32 * GIB, 30.75 * GIB, 1200e9,
                   "https://cloud.google.com/tpu/docs/v4"),
    "v5e": ChipSpec("v5e", 197e12, 16e9, 15.75 * GIB, 819e9,
                    "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": ChipSpec("v5p", 459e12, 95e9, 95.74 * GIB, 2765e9,
                    "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": ChipSpec("v6e", 918e12, 32e9, 31.25 * GIB, 1638e9,
                    "https://cloud.google.com/tpu/docs/v6e"),
}
# device_kind of a TPU device -> chip (compile-only devices report the same kinds)
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e"}
# the libtpu spelling of each version in a "VERSION:AxB[xC]" topology name
LIBTPU_NAMES = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}
ALIASES = {"v4": "v4", "v5p": "v5p", "v5": "v5p", "v5e": "v5e", "v5litepod": "v5e",
           "v6e": "v6e"}

# Slice shapes by chip count. 3-D (v4, v5p): the shapes of the v4 and v5p pages' tables; a
# full 4x4x4 cube and larger are tori. 2-D (v5e, v6e): the shapes of the v5e / v6e pages.
SHAPES_3D = {4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
             128: (4, 4, 8), 192: (4, 4, 12), 256: (4, 8, 8), 512: (8, 8, 8),
             768: (8, 8, 12), 1024: (8, 8, 16), 2048: (8, 16, 16), 4096: (16, 16, 16),
             6144: (16, 16, 24)}
SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8),
             128: (8, 16), 256: (16, 16)}
TENSORCORES_PER_CHIP = {"v4": 2, "v5p": 2, "v5e": 1, "v6e": 1}


class TopologyError(ValueError):
  """A topology name that cannot be read, or a slice that does not exist."""


class LibtpuMissing(RuntimeError):
  """libtpu (the TPU compiler) is not installed."""


@dataclasses.dataclass(frozen=True)
class Topology:
  """A slice to compile for.

  Attributes:
    name: as given on the command line.
    chip: the chip's figures (None for `local` devices that are not a known TPU).
    shape: chip grid, e.g. (4, 4, 4); () for `local`.
    chips: devices of the mesh (one per chip).
  """

  name: str
  chip: ChipSpec | None
  shape: tuple[int, ...]
  chips: int

  @property
  def libtpu_name(self) -> str:
    """The chip-grid name libtpu takes, e.g. "v5p:4x4x4"."""
    return f"{LIBTPU_NAMES[self.chip.name]}:{'x'.join(map(str, self.shape))}"

  def compile_options(self) -> dict:
    """Keyword arguments of `get_topology_desc` beyond the name (MaxText passes the same:
    megacore chips for v4, one chip per host for a single chip, tori for full cubes)."""
    kw = {}
    if self.chip.name == "v4":
      kw["chip_config_name"] = "megacore"
    if self.chips == 1:
      kw["chips_per_host_bounds"] = (1, 1, 1)
    wrap = _wrap(self.shape)
    if any(wrap):
      kw["wrap"] = wrap
    return kw


def _wrap(shape) -> tuple[bool, ...]:
  """Torus links: a 3-D slice of whole 4x4x4 cubes, a 2-D dimension of 16 chips."""
  if len(shape) == 3:
    cube = all(d % 4 == 0 for d in shape) and math.prod(shape) >= 64
    return (cube,) * 3
  return tuple(d == 16 for d in shape) + (False,)


def _known(table, per_chip=1) -> str:
  return ", ".join(str(n * per_chip) for n in sorted(table))


def parse_topology(name: str) -> Topology:
  """`v5p-64`, `v4-32`, `v5litepod-16` / `v5e-16`, `v6e-8`, `v5p:4x4x4`, or `local`.

  Raises:
    TopologyError: naming what is accepted.
  """
  text = name.strip().lower()
  if text == "local":
    return Topology(name=name, chip=None, shape=(), chips=0)
  grid = re.fullmatch(r"([a-z0-9]+):(\d+(?:x\d+){1,2})", text)
  if grid:
    version = ALIASES.get(grid.group(1))
    dims = tuple(int(d) for d in grid.group(2).split("x"))
    if version is None:
      raise TopologyError(f"unknown TPU version {grid.group(1)!r} in {name!r}; "
                          f"known: {sorted(ALIASES)}")
    want = 3 if version in ("v4", "v5p") else 2
    if len(dims) != want or 0 in dims:
      raise TopologyError(f"{name!r}: {version} takes a {want}-D chip grid, e.g. "
                          f"{version}:{'x'.join(['2'] * want)}")
    return Topology(name=name, chip=CHIPS[version], shape=dims, chips=math.prod(dims))
  slice_ = re.fullmatch(r"([a-z0-9]+)-(\d+)", text)
  if not slice_ or ALIASES.get(slice_.group(1)) is None or slice_.group(1) == "v5":
    raise TopologyError(
        f"unknown topology {name!r}: use a Google Cloud slice name (v4-N or v5p-N: N "
        "TensorCores; v5litepod-N, v5e-N or v6e-N: N chips), a chip grid such as v5p:4x4x4 "
        "or v5e:2x2, or 'local'")
  version, count = ALIASES[slice_.group(1)], int(slice_.group(2))
  per_chip = TENSORCORES_PER_CHIP[version]
  table = SHAPES_3D if version in ("v4", "v5p") else SHAPES_2D
  unit = "TensorCores (two per chip)" if per_chip == 2 else "chips"
  if count % per_chip or count // per_chip not in table:
    grid = "x".join(["4"] * len(next(iter(table.values()))))
    raise TopologyError(f"{name!r} is not a {version} slice this table knows: {version}-N counts "
                        f"{unit} and takes N in [{_known(table, per_chip)}] (or give the chip "
                        f"grid, e.g. {version}:{grid})")
  chips = count // per_chip
  return Topology(name=name, chip=CHIPS[version], shape=table[chips], chips=chips)


def sub_topology(topology: Topology, chips: int) -> Topology:
  """A slice of `chips` chips of the same version: compile-only devices must be a whole
  slice (libtpu numbers a program's devices from 0), so a trainer's or a sampler's share
  of a slice is planned on a slice of its own size.

  Raises:
    TopologyError: no slice of that size.
  """
  table = SHAPES_3D if len(topology.shape) == 3 else SHAPES_2D
  if chips not in table:
    raise TopologyError(f"{topology.name}: a share of {chips} chips (parallel.num_devices / "
                        f"parallel.sampler_devices) is not a {topology.chip.name} slice; "
                        f"shares of [{_known(table)}] chips can be planned")
  return Topology(name=f"{topology.chip.name}:{'x'.join(map(str, table[chips]))}",
                  chip=topology.chip, shape=table[chips], chips=chips)


def libtpu_installed() -> bool:
  """Whether the TPU compiler (the `libtpu` package) can be imported."""
  return importlib.util.find_spec("libtpu") is not None


@contextlib.contextmanager
def _quiet_stderr(captured: list):
  """Sends file descriptor 2 to a temporary file (libtpu's C++ start-up warnings on a host
  without a TPU), appending what was written to `captured`."""
  with tempfile.TemporaryFile(mode="w+b") as tmp:
    saved = os.dup(2)
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      captured.append(tmp.read().decode(errors="replace"))


def topology_devices(topology: Topology):
  """The devices of `topology`: compile-only TPU devices, or the host's own for `local`.

  Raises:
    LibtpuMissing: a TPU topology without libtpu (the message says how to install it).
    TopologyError: libtpu rejects the topology.
  """
  if topology.chip is None and topology.name.strip().lower() == "local":
    return list(jax.devices())
  if not libtpu_installed():
    raise LibtpuMissing(f"compiling for {topology.name} needs libtpu: {INSTALL_HINT}")
  # a compile-only client needs no TPU and no lock on one: several plans may run at once
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  captured: list = []
  try:
    with _quiet_stderr(captured):
      desc = topologies.get_topology_desc(topology_name=topology.libtpu_name, platform="tpu",
                                          **topology.compile_options())
  except Exception as err:  # noqa: BLE001 - libtpu reports a bad name as a runtime error
    raise TopologyError(f"libtpu cannot build {topology.name} ({topology.libtpu_name}): "
                        f"{str(err).splitlines()[0]}") from err
  devices = list(desc.devices)
  if len(devices) != topology.chips:
    raise TopologyError(f"{topology.name}: libtpu made {len(devices)} devices for "
                        f"{topology.chips} chips")
  return devices


def local_topology(devices) -> Topology:
  """`local` resolved: the chip of the host's devices when they are a known TPU."""
  kind = getattr(devices[0], "device_kind", "")
  chip = CHIPS.get(DEVICE_KINDS.get(kind, ""))
  return Topology(name="local", chip=chip, shape=(), chips=len(devices))


def local_memory(device) -> float | None:
  """A local device's memory limit in bytes, when its backend reports one."""
  try:
    stats = device.memory_stats() or {}
  except Exception:  # noqa: BLE001 - CPU devices may not implement memory_stats
    return None
  limit = stats.get("bytes_limit")
  return float(limit) if limit else None
