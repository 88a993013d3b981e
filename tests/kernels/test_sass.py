"""kernels.sass's reading of disassembled SASS, on hand-written instruction lines."""

from __future__ import annotations

from kernels.sass import loads_before_first_use


def _sass(*instructions: str) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {ins} ;"
                     for i, ins in enumerate(instructions))


def test_loads_count_until_an_instruction_reads_one_of_their_results() -> None:
    text = _sass("IMAD R2, R0, 0x10, RZ",
                 "LDG.E.128.CONSTANT R4, desc[UR4][R2.64]",  # writes R4-R7
                 "LDG.E.64 R8, desc[UR4][R2.64+0x10]",       # writes R8-R9
                 "IADD3 R10, R2, 0x1, RZ",                   # reads none of them
                 "@!P0 LDG.E R11, desc[UR4][R12.64]",
                 "LOP3.LUT R13, R7, 0xff, RZ, 0xc0, !PT",    # reads R7: the first use
                 "LDG.E R14, desc[UR4][R2.64]")
    assert loads_before_first_use(text) == 3


def test_a_load_whose_address_is_a_pending_result_is_a_use() -> None:
    assert loads_before_first_use(_sass("LDG.E.64 R4, desc[UR4][R2.64]",
                                        "LDG.E R6, desc[UR4][R4.64]")) == 1
    # a store of a loaded value reads it; a result overwritten before it is read is no use
    assert loads_before_first_use(_sass("LDG.E R4, desc[UR4][R2.64]",
                                        "MOV R4, RZ",
                                        "IADD3 R9, R4, 0x1, RZ",
                                        "LDG.E R5, desc[UR4][R2.64+0x4]",
                                        "STG.E desc[UR4][R8.64], R5")) == 2
    assert loads_before_first_use(_sass("IMAD R2, R0, 0x10, RZ")) == 0
