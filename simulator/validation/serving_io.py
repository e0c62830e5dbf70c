"""Serving measurements as users have them: a CSV, or ``vllm bench serve --save-result`` JSON.

Both are read into one frame of canonical columns (one row per benchmark point; format in
docs/VALIDATION.md), every value checked and aliased (:mod:`simulator.validation.aliases`).
A bad value is a :class:`~simulator.errors.ConfigError` naming file, row (and line) and
column. The JSON keys are those ``vllm bench serve`` writes (vllm-project/vllm
``vllm/benchmarks/serve.py``: ``model_id``, ``num_prompts``, ``max_concurrency``,
``request_rate``, ``completed``, ``total_input_tokens``, ``total_output_tokens``,
``mean_/median_{ttft,tpot,itl,e2el}_ms``, ``output_throughput``, and any ``--metadata
KEY=VALUE`` pairs, which may name ``device``, ``tp``, ``engine_version`` ...).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import ConfigError
from simulator.hardware.registry import device_names
from simulator.models.catalog import get_model, model_names
from simulator.validation import aliases

MEASURED = ("measured_ttft_ms", "measured_tpot_ms", "measured_itl_ms", "measured_e2e_ms",
            "measured_output_tok_s")
INTS = ("tp", "pp", "ep", "dp", "input_len", "output_len", "concurrency", "num_requests",
        "max_num_seqs", "max_num_batched_tokens", "seed", "warmup_requests")
FLOATS = ("request_rate", "memory_utilization", "concurrency_ramp_s", *MEASURED)
TEXT = ("model", "model_id", "device", "engine", "engine_version", "precision",
        "kv_precision", "arrival", "statistic", "split", "source", "notes")
BOOLS = ("chunked_prefill", "attention_dp")
COLUMNS = (*TEXT, *INTS, *FLOATS, *BOOLS)
REQUIRED = ("model", "device", "input_len", "output_len")
ARRIVALS = ("all_at_once", "closed_loop", "poisson")
DEFAULT_REQUESTS = 1000  # `vllm bench serve --num-prompts` default


def _present(value: object) -> bool:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return False
    return str(value).strip() != ""


def _number(value: object, col: str, where: str, file: str, *, integer: bool) -> float | None:
    if not _present(value):
        return None
    try:
        x = float(str(value).strip())
    except ValueError:
        raise ConfigError(f"must be a number, got {value!r}", file=file, key=where) from None
    if math.isnan(x) or x <= 0 or math.isinf(x):
        raise ConfigError(f"must be a finite number > 0, got {value!r}", file=file, key=where)
    if integer and x != int(x):
        raise ConfigError(f"must be a whole number, got {value!r}", file=file, key=where)
    return x


_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def _flag(value: object, where: str, file: str) -> bool | None:
    if not _present(value):
        return None
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"must be true or false (yes/no, on/off, 1/0), got {value!r}", file=file,
                      key=where)


def normalise(records: Iterable[Mapping[Any, Any]], file: str, *, line_offset: int = 2,
              defaults: Mapping[str, Any] | None = None,
              lines: list[int] | None = None) -> pd.DataFrame:
    """Check and alias every record; the canonical frame (errors name row and column).

    ``lines`` are the records' line numbers in the file (default: ``row + line_offset - 1``).
    """
    devices, catalog = device_names(), model_names()
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(records):
        rec = {**(defaults or {}), **{aliases.column(k): v for k, v in raw.items()}}
        line = lines[i] if lines is not None and i < len(lines) else i + line_offset
        row: dict[str, Any] = {"file": file, "row": i + 1, "line": line}

        def key(col: str, i: int = i, line: int = line) -> str:
            return f"row {i + 1} (line {line}).{col}"

        for col in REQUIRED:
            if not _present(rec.get(col)):
                raise ConfigError(f"{col} is required", file=file, key=key(col))
        try:
            ref = aliases.model(rec["model"], catalog)
            row["model"], row["model_id"] = ref.name, str(rec["model"]).strip()
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=key("model")) from None
        try:
            row["device"] = aliases.device(rec["device"], devices)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=key("device")) from None
        try:
            row["engine"] = aliases.engine(rec.get("engine") if _present(rec.get("engine")) else "vllm")
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=key("engine")) from None
        for col in ("precision", "kv_precision"):
            if _present(rec.get(col)):
                try:
                    row[col] = aliases.precision(rec[col])
                except ValueError as exc:
                    raise ConfigError(str(exc), file=file, key=key(col)) from None
        if "precision" not in row:
            row["precision"] = ref.precision or "bf16"
        elif ref.precision and ref.precision != row["precision"]:
            raise ConfigError(f"model {row['model_id']!r} is a {ref.precision} checkpoint but "
                              f"precision says {row['precision']}", file=file, key=key("precision"))
        row.setdefault("kv_precision", row["precision"])
        for col in (*INTS, *FLOATS):
            if col in rec:
                x = _number(rec[col], col, key(col), file, integer=col in INTS)
                if x is not None:
                    row[col] = int(x) if col in INTS else x
        for col in BOOLS:
            flag = _flag(rec.get(col), key(col), file)
            if flag is not None:
                row[col] = flag
        if row.get("attention_dp"):
            row.setdefault("ep", row.get("tp", 1))  # the experts span every attention rank
            _check_attention_dp(row, file, key)
        if "memory_utilization" in row and row["memory_utilization"] > 1:
            raise ConfigError("memory_utilization is a fraction in (0, 1]", file=file,
                              key=key("memory_utilization"))
        for col in ("engine_version", "split", "source", "notes"):
            if _present(rec.get(col)):
                row[col] = str(rec[col]).strip()
        row["arrival"] = _arrival(rec, row, file, key)
        stat = str(rec["statistic"]).strip().lower() if _present(rec.get("statistic")) else "mean"
        if stat not in ("mean", "median"):
            raise ConfigError(f"statistic must be mean or median, got {rec['statistic']!r}",
                              file=file, key=key("statistic"))
        row["statistic"] = stat
        if not any(c in row for c in MEASURED):
            raise ConfigError(f"no measured value; fill one of {', '.join(MEASURED)}",
                              file=file, key=key("measured_*"))
        row.setdefault("num_requests", DEFAULT_REQUESTS)
        out.append(row)
    if not out:
        raise ConfigError("no rows", file=file)
    frame = pd.DataFrame(out)
    ordered = [c for c in ("file", "row", "line", *COLUMNS) if c in frame.columns]
    return frame[ordered]


def _check_attention_dp(row: dict[str, Any], file: str, key: Any) -> None:
    """``attention_dp``: the ``tp`` ranks run attention data-parallel and the experts
    expert-parallel over all of them, so ``ep`` is ``tp`` and the model is MoE."""
    tp = row.get("tp", 1)
    if tp < 2:
        raise ConfigError("attention_dp needs tp >= 2: the tp ranks become the attention "
                          "data-parallel ranks", file=file, key=key("tp"))
    if row["ep"] != tp:
        raise ConfigError(f"with attention_dp the experts run expert-parallel over all tp ranks: "
                          f"ep must be {tp} (tp) or empty, got {row['ep']}", file=file,
                          key=key("ep"))
    if not get_model(row["model"]).is_moe:
        raise ConfigError(f"attention_dp is for MoE models ({row['model']} is dense): the "
                          "ranks' experts are what the data-parallel ranks share", file=file,
                          key=key("attention_dp"))


def _arrival(rec: Mapping[str, Any], row: dict[str, Any], file: str, key: Any) -> str:
    """Closed loop when a concurrency is given, Poisson with a rate, else all at once."""
    if _present(rec.get("arrival")):
        kind = str(rec["arrival"]).strip().lower()
        if kind not in ARRIVALS:
            raise ConfigError(f"unknown arrival {rec['arrival']!r}; allowed: {', '.join(ARRIVALS)}",
                              file=file, key=key("arrival"))
    elif "concurrency" in row:
        kind = "closed_loop"
    elif "request_rate" in row:
        kind = "poisson"
    else:
        kind = "all_at_once"
    needs = {"closed_loop": "concurrency", "poisson": "request_rate"}.get(kind)
    if needs and needs not in row:
        raise ConfigError(f"arrival {kind} needs {needs} > 0", file=file, key=key(needs))
    return kind


def read_csv(path: str | Path) -> pd.DataFrame:
    file = str(path)
    try:
        df = pd.read_csv(path, comment="#", skipinitialspace=True, dtype=str)
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise ConfigError(f"cannot read CSV ({type(exc).__name__}: {exc})", file=file) from None
    headers = [aliases.column(c) for c in df.columns]
    missing = [c for c in REQUIRED if c not in headers]
    if missing:
        raise ConfigError(f"missing column(s) {missing}; see docs/VALIDATION.md for the format",
                          file=file, key="header")
    if not any(c in headers for c in MEASURED):
        raise ConfigError(f"needs at least one measured column: {', '.join(MEASURED)}",
                          file=file, key="header")
    return normalise(df.to_dict("records"), file, lines=_data_lines(Path(path)))


def _data_lines(path: Path) -> list[int]:
    """Line numbers of the data rows: what is not blank, not a comment, not the header."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    numbers = [n for n, line in enumerate(text.splitlines(), 1)
               if line.strip() and not line.lstrip().startswith("#")]
    return numbers[1:]


# ----- vllm bench serve --save-result ----------------------------------------------------
_JSON_METRICS = {"ttft": "measured_ttft_ms", "tpot": "measured_tpot_ms",
                 "itl": "measured_itl_ms", "e2el": "measured_e2e_ms"}


def _json_objects(path: Path) -> list[dict[str, Any]]:
    """One result per file, or one per line (``--append-result`` writes several)."""
    file = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found", file=file) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read ({type(exc).__name__}: {exc})", file=file) from None
    try:
        data = json.loads(text)
        objs = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        objs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                objs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"not JSON ({exc.msg})", file=file, key=f"line {n}") from None
    if not all(isinstance(o, dict) for o in objs):
        raise ConfigError("expected vllm bench serve result objects", file=file)
    return objs


def vllm_bench_record(obj: Mapping[str, Any], statistic: str = "mean") -> dict[str, Any]:
    """One ``vllm bench serve`` result as a serving-CSV record (lengths are per-request
    means: ``total_*_tokens / completed``)."""
    rec: dict[str, Any] = {k: v for k, v in obj.items()
                           if not isinstance(v, (list, dict)) and aliases.column(k) in COLUMNS}
    rec["model"] = obj.get("model_id", obj.get("model"))
    completed = obj.get("completed") or obj.get("num_prompts")
    if completed:
        for total, col in (("total_input_tokens", "input_len"), ("total_output_tokens", "output_len")):
            if obj.get(total) is not None and col not in rec:
                rec[col] = round(float(obj[total]) / float(completed))
        rec["num_requests"] = completed
    rec.pop("request_rate", None)
    rate = obj.get("request_rate")
    if rate is not None and str(rate) != "inf" and not obj.get("max_concurrency"):
        rec["request_rate"] = rate
    if obj.get("max_concurrency"):
        rec["concurrency"] = obj["max_concurrency"]
    for name, col in _JSON_METRICS.items():
        value = obj.get(f"{statistic}_{name}_ms")
        if value is not None and float(value) > 0:
            rec[col] = value
    if obj.get("output_throughput"):
        rec["measured_output_tok_s"] = obj["output_throughput"]
    rec["statistic"] = statistic
    rec.setdefault("source", f"vllm bench serve result {obj.get('date', '')}".strip())
    return rec


def read_vllm_json(path: str | Path, defaults: Mapping[str, Any] | None = None,
                   statistic: str = "mean") -> pd.DataFrame:
    path = Path(path)
    records = [vllm_bench_record(o, statistic) for o in _json_objects(path)]
    # Options given on the command line fill what the JSON's --metadata did not say.
    return normalise(records, str(path), line_offset=1, defaults=defaults)


def read_serving(paths: str | Path | Iterable[str | Path],
                 defaults: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Every file (CSV, or ``.json``/``.jsonl`` from ``vllm bench serve``) in one frame."""
    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    frames = []
    for p in items:
        path = Path(p)
        if path.suffix.lower() in (".json", ".jsonl"):
            frames.append(read_vllm_json(path, defaults))
        else:
            frames.append(read_csv(path))
    if not frames:
        raise ConfigError("no result files given")
    return pd.concat(frames, ignore_index=True)
