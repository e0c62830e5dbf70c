"""The Operators tables of docs/VALIDATION.md, printed from the kernel-fit error file."""

from simulator.validation.kernel_fit_report import above_table, device_table, main


def _row(engine, device, op, after, before=50.0):
    return {"device": device, "engine": engine, "op": op, "kept": True, "held_out_rows": 7,
            "fit_rows": 21, "median_ape_before": before, "median_ape_after": after,
            "p90_ape_after": after * 3, "median_error_after": -0.4}


ROWS = {"vllm": [_row("vllm", "H100-SXM", "gemm", 8.1), _row("vllm", "L40S", "gemm", 11.4),
                 _row("vllm", "L40S", "attention_decode_all_kv", 10.0)],
        "sglang": [_row("sglang", "B200", "moe", 16.6), _row("sglang", "B200", "gemm", 9.99)]}


def test_above_table_lists_the_cells_at_or_above_the_target_worst_first():
    lines = above_table(ROWS)
    assert lines[0] == "3 of 5 cells at or above 10 % held out:"
    body = lines[4:]
    assert [line.split(" | ")[1:3] for line in body] == [
        ["B200", "moe"], ["L40S", "gemm"], ["L40S", "attention_decode (BF16 + FP8 KV)"]]
    assert "**16.6**" in body[0]
    assert "-0.4" in body[0]


def test_above_table_with_every_cell_below_lists_the_highest():
    below = {"vllm": [_row("vllm", "H100-SXM", "gemm", 9.9), _row("vllm", "B200", "gemm", 4.0)],
             "sglang": [_row("sglang", "L40S", "moe", 9.95)]}
    lines = above_table(below)
    assert lines[0] == "0 of 3 cells at or above 10 % held out; the 3 highest:"
    assert [line.split(" | ")[1:3] for line in lines[4:]] == [
        ["L40S", "moe"], ["H100-SXM", "gemm"], ["B200", "gemm"]]
    many = {"vllm": [_row("vllm", "H100-SXM", f"gemm{i}", 1.0 + i) for i in range(8)]}
    assert len(above_table(many)) == 4 + 5


def test_device_table_shows_the_previous_fit_beside_this_one():
    prev = {"vllm": [_row("vllm", "L40S", "gemm", 12.0)]}
    lines = device_table(ROWS, prev, "vllm")
    l40s = next(line for line in lines if line.startswith("| L40S | gemm |"))
    assert "| 12.0 | **11.4** |" in l40s


def test_main_prints_the_three_tables(tmp_path, capsys):
    import json
    path = tmp_path / "errors.json"
    path.write_text(json.dumps(ROWS))
    main([str(path)])
    out = capsys.readouterr().out
    assert "| device | operator |" in out
    assert "| engine | operator family |" in out
    assert "3 of 5 cells at or above 10 % held out:" in out
