"""scripts/sass_loops.py's parser and loop finder, on a few fixed lines of
SASS as cuobjdump -sass prints them (no GPU or CUDA tools needed)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import sass_loops  # noqa: E402

SASS = """
        Function : flashmla_perm_k
        /*0000*/                   LDC R1, c[0x0][0x28] ;                /* 0x00000a00ff017b82 */
                                                                         /* 0x000fe20000000800 */
        /*0010*/                   IMAD.MOV.U32 R2, RZ, RZ, RZ ;
        /*0020*/                   IADD3 R2, R2, 0x1, RZ ;
        /*0030*/              @!PT LDS RZ, [RZ] ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3], desc[UR6][R4.64] ;
        /*0050*/                   ISETP.GE.U32.AND P1, PT, R2, R5, PT ;
        /*0060*/              @!P1 BRA 0x20 ;
        /*0070*/                   LDS.128 R8, [R3] ;
        /*0080*/              @P2 BRA 0xb0 ;
        /*0090*/                   IMAD R6, R6, R7, RZ ;
        /*00a0*/              @P3 BRA 0x90 ;
        /*00b0*/                   STG.E.128 desc[UR6][R6.64], R8 ;
        /*00c0*/              @!P1 BRA 0x70 ;
        /*00d0*/              @!P0 BRA 0x10 ;
        /*00e0*/                   EXIT ;
        /*00f0*/                   BRA 0xf0;
"""


def test_parse_reads_addresses_predicates_and_opcodes():
    code = sass_loops.parse(SASS)["flashmla_perm_k"]
    assert len(code) == 16
    assert code[3] == (0x30, "@!PT", "LDS", "RZ, [RZ]")
    assert code[6] == (0x60, "@!P1", "BRA", "0x20")


def test_innermost_memory_loops_and_their_trips():
    found = sass_loops.loops(sass_loops.parse(SASS)["flashmla_perm_k"])
    # The outer loop (0x10 .. 0xd0) holds the others; the one at 0x90 moves
    # no memory (it counts once in its loop's trip); BRA 0xf0 to itself is
    # no loop; the padding LDS under @!PT is no memory access.
    assert found == [
        (0x20, 0x60, 5, 5, "LDGSTS.E.BYPASS.128x1"),
        (0x70, 0xC0, 4, 6, "LDS.128x1 STG.E.128x1"),  # the `if` taken: 4, not: 6
    ]
