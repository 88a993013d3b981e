"""SASS inspection of built cubins: which Tensor Core instructions, registers, spills, and how
many global loads a thread issues before it waits for one.

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


_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[0-7T]\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_REGISTER = re.compile(r"\bR(\d+)\b")
_WIDTH = {".128": 4, ".64": 2}


def loads_before_first_use(text: str) -> int:
    """Global loads (LDG) issued, in program order from the first one, before an instruction
    reads the result of one of them: the loads that share one memory round trip on the
    straight-line path (a thread that needs a load's value before its next load issues
    waits one round trip a load)."""
    pending: set[int] = set()
    count = 0
    for opcode, operands in _INSTRUCTION.findall(text):
        ops = [o.strip() for o in operands.split(",")] if operands.strip() else []
        writes = not opcode.startswith(("ST", "RED", "BRA")) and bool(ops)  # ops[0]: its result
        # a 64-bit address Rn.64 reads Rn and Rn+1
        used = {int(r) + k for o in ops[writes:] for r in _REGISTER.findall(o)
                for k in range(2 if ".64" in o else 1)}
        if pending & used:
            return count
        if opcode.startswith("LDG"):
            width = next((w for s, w in _WIDTH.items() if s in opcode), 1)
            first = int(_REGISTER.findall(ops[0])[0])
            pending.update(range(first, first + width))
            count += 1
        elif writes:  # a result overwritten before it was read
            pending.difference_update(int(r) for r in _REGISTER.findall(ops[0]))
    return count
