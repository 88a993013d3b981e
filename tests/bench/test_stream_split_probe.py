from bench.gpu.stream_split_probe import halved


def test_halves_take_the_whole_batch_records_under_the_half_batch_keys() -> None:
    rec = {"n8_h56_w56_c64_k64_r1_s1_st1x1_p0x0_d1x1|int8|h200": {"schedule": {"CHUNK": 2}},
           "n32_h56_w56_c64_k64_r1_s1_st1x1_p0x0_d1x1|int8|h200": {"schedule": {"CHUNK": 4}},
           "n80_h7_w7_c512_k512_r3_s3_st1x1_p1x1_d1x1|fp16|h200": {"schedule": {"CHUNK": 8}}}
    assert halved(rec, 8) == {
        "n4_h56_w56_c64_k64_r1_s1_st1x1_p0x0_d1x1|int8|h200": {"schedule": {"CHUNK": 2}}}
    assert list(halved(rec, 32)) == ["n16_h56_w56_c64_k64_r1_s1_st1x1_p0x0_d1x1|int8|h200"]
