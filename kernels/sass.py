"""SASS inspection of built cubins: which Tensor Core instructions, registers, spills.

Uses cuobjdump (pip `nvidia-cuda-cuobjdump`) and the nvdisasm it calls (pip
`nvidia-cuda-nvdisasm`), located inside the `nvidia` namespace package, or on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


def _tool(name: str) -> str | None:
    try:
        import nvidia  # namespace package of the pip CUDA wheels

        for root in nvidia.__path__:
            for sub in ("cu13/bin", "cuda_cuobjdump/bin", "cuda_nvdisasm/bin"):
                p = Path(root) / sub / name
                if p.exists():
                    return str(p)
    except ImportError:
        pass
    return shutil.which(name)


def cuobjdump_path() -> str | None:
    return _tool("cuobjdump")


def nvdisasm_path() -> str | None:
    return _tool("nvdisasm")


@dataclass
class SassSummary:
    mma: list[str]  # distinct Tensor Core opcodes, e.g. IMMA.16832.S8.S8
    registers: int
    stack: int
    local_loads: int  # LDL instructions
    local_stores: int  # STL instructions
    text: str

    @property
    def spills(self) -> bool:
        return self.local_loads > 0 or self.local_stores > 0


def summarize(cubin: bytes | str | os.PathLike[str]) -> SassSummary:
    """Disassemble a cubin (bytes or path) and count what matters."""
    tool = cuobjdump_path()
    if tool is None:
        raise FileNotFoundError("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    env = dict(os.environ)
    dis = nvdisasm_path()
    if dis:
        env["PATH"] = str(Path(dis).parent) + os.pathsep + env.get("PATH", "")
    with tempfile.TemporaryDirectory() as tmp:
        if isinstance(cubin, bytes):
            path = Path(tmp) / "k.cubin"
            path.write_bytes(cubin)
        else:
            path = Path(cubin)
        sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True,
                              env=env, check=True).stdout
        res = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True,
                             env=env, check=True).stdout
    mma = sorted(set(re.findall(r"\b([HI]MMA\.[\w.]+|[HIQ]GMMA\.[\w.]+)", sass)))
    reg = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    return SassSummary(
        mma=mma, registers=int(reg.group(1)) if reg else -1,
        stack=int(stack.group(1)) if stack else -1,
        local_loads=len(re.findall(r"\bLDL\b", sass)),
        local_stores=len(re.findall(r"\bSTL\b", sass)),
        text=sass,
    )
