"""The vocabulary shared by dispatch, backends and kernel families (data only, no CUDA, no kernels):
``Call`` -- what one op call asks for -- and ``Candidate`` -- one way to run it (backend, family, config)."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields

import torch

from .formats.scheme import QuantScheme

OPS = ("quant_linear", "grouped_linear", "fused_moe")


def interpreting() -> bool:
    """Triton kernels run on CPU tensors under the interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def m_bucket(m: int) -> int:
    """The power of two at or above M: the M axis of the measured table."""
    return 1 << max(0, math.ceil(math.log2(max(m, 1))))


@dataclass(frozen=True)
class Call:
    """One op call as dispatch sees it.  ``m``: rows of x (grouped: routed rows, all experts together);
    ``experts``: 0 for a dense weight."""
    op: str
    scheme: QuantScheme
    dtype: torch.dtype
    m: int
    n: int
    k: int
    experts: int = 0
    act_order: bool = False
    device_type: str = "cuda"
    facts: object = None  # capability.DeviceFacts of the device (None: not known, no capability check)

    @property
    def shape_key(self) -> str:
        return f"{self.experts}x{self.n}x{self.k}" if self.experts else f"{self.n}x{self.k}"

    @property
    def table_key(self) -> str:
        """``op|scheme|NxK|m<bucket>`` (grouped: ``ExNxK``): the measured table's key."""
        return f"{self.op}|{self.scheme.name}|{self.shape_key}|m{m_bucket(self.m)}"


@dataclass(frozen=True)
class KernelConfig:
    """How fast it runs, never what it computes (a tile size cannot change a result beyond fp32 summation
    order): the one launch-config object of every kernel family.  Families that take no config use the
    defaults."""
    family: str
    block_m: int = 16
    block_n: int = 64
    block_k: int = 64
    split_k: int = 1
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "KernelConfig":
        names = {f.name for f in fields(KernelConfig)}
        return KernelConfig(**{k: v for k, v in d.items() if k in names})

    def describe(self) -> str:
        return (f"bm={self.block_m} bn={self.block_n} bk={self.block_k} sk={self.split_k} w={self.num_warps} "
                f"st={self.num_stages}")


@dataclass(frozen=True)
class Candidate:
    """One way to run a call: a registered backend, one of its kernel families, and that family's config."""
    backend: str
    family: str
    config: KernelConfig | None = None

    def describe(self) -> str:
        cfg = f" {self.config.describe()}" if self.config is not None else ""
        return f"{self.backend}/{self.family}{cfg}"

    def to_json(self) -> dict:
        return {"backend": self.backend, "family": self.family,
                "config": self.config.to_json() if self.config is not None else {}}

    @staticmethod
    def from_json(d: dict) -> "Candidate":
        cfg = d.get("config") or None
        return Candidate(d["backend"], d["family"], KernelConfig.from_json({**cfg, "family": d["family"]})
                         if cfg else None)
