"""`tokenspeed bench` end to end: small workloads against the real tiny-model server, the
offline engine benchmark, and user errors (one line, non-zero exit, no traceback)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from serving_helpers import REPO_ROOT, Server, free_port
from typer.testing import CliRunner

from tokenspeed_cli.bench.cli import app

LATENCY_KEYS = [
    f"{stat}_{name}_ms"
    for name in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p90", "p99")
]
SUMMARY_KEYS = [
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "prefix_cache_hit_rate", *LATENCY_KEYS,
]  # fmt: skip
ARRAY_KEYS = ["input_lens", "output_lens", "ttfts", "itls", "e2els", "cached_tokens", "errors"]


def bench(tmp_path: Path, server: Server, *args: str) -> dict[str, Any]:
    """Run `bench serve` in this process and return the saved result file."""
    out = tmp_path / "result.json"
    result = CliRunner().invoke(
        app, ["serve", "--base-url", server.url, "--save-result", str(out), *args]
    )
    assert result.exit_code == 0, result.output
    assert "Serving benchmark result" in result.output
    return json.loads(out.read_text())


def check_consistent(r: dict[str, Any], n: int) -> None:
    """Every metric present and finite; totals are the sums over requests."""
    for key in SUMMARY_KEYS + ARRAY_KEYS:
        assert key in r, key
    for key in SUMMARY_KEYS:
        if r[key] is not None:
            assert math.isfinite(r[key]) and r[key] >= 0, key
    assert r["completed"] == n and r["failed"] == 0 and r["num_prompts"] == n
    assert all(len(r[k]) == n for k in ARRAY_KEYS)
    assert r["errors"] == [""] * n
    assert r["total_input_tokens"] == sum(r["input_lens"])
    assert r["total_output_tokens"] == sum(r["output_lens"])
    d = r["duration"]
    assert r["request_throughput"] == pytest.approx(n / d)
    assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / d)
    total = r["total_input_tokens"] + r["total_output_tokens"]
    assert r["total_token_throughput"] == pytest.approx(total / d)
    assert r["prefix_cache_hit_rate"] == pytest.approx(
        sum(r["cached_tokens"]) / r["total_input_tokens"]
    )
    for ttft, e2el, itl, out in zip(
        r["ttfts"], r["e2els"], r["itls"], r["output_lens"], strict=True
    ):
        assert 0 < ttft <= e2el and e2el <= d
        assert len(itl) <= out - 1  # a chunk carries at least one token
        assert ttft + sum(itl) <= e2el
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert r[f"p99_{name}_ms"] >= r[f"p90_{name}_ms"] >= r[f"median_{name}_ms"] > 0
    assert r["mean_e2el_ms"] >= r["mean_ttft_ms"]


def test_random_workload(server: Server, tmp_path: Path) -> None:
    r = bench(tmp_path, server, "--dataset", "random", "--num-prompts", "12",
              "--random-input-len", "32", "--random-output-len", "8", "--request-rate", "40",
              "--goodput", "ttft:600000 e2el:600000", "--seed", "101")  # fmt: skip
    check_consistent(r, 12)
    assert r["backend"] == "openai" and r["model_id"] == "tokenspeed-tiny"
    assert r["input_lens"] == [32] * 12  # exact prompt lengths (completions: no template)
    assert r["output_lens"] == [8] * 12  # ignore_eos + max_tokens
    assert r["request_goodput"] == pytest.approx(r["request_throughput"])  # lenient SLOs
    assert r["mean_tpot_ms"] > 0 and r["mean_itl_ms"] > 0


def test_shared_prefix_workload_hits_the_cache(server: Server, tmp_path: Path) -> None:
    r = bench(tmp_path, server, "--dataset", "generated-shared-prefix", "--endpoint", "chat",
              "--gsp-num-groups", "2", "--gsp-prompts-per-group", "3",
              "--gsp-system-prompt-len", "64", "--gsp-question-len", "16",
              "--gsp-output-len", "6", "--max-concurrency", "1", "--seed", "202")  # fmt: skip
    check_consistent(r, 6)
    assert r["backend"] == "openai-chat" and r["max_concurrent_requests"] == 1
    assert len(set(r["input_lens"])) == 1 and r["input_lens"][0] > 80  # + chat template
    cached = r["cached_tokens"]
    assert cached[0] == 0 and cached[3] == 0  # each group's first request is new
    assert all(c >= 48 for i, c in enumerate(cached) if i % 3)  # the system prompt's pages
    assert r["prefix_cache_hit_rate"] > 0


def test_multi_turn_workload(server: Server, tmp_path: Path) -> None:
    r = bench(tmp_path, server, "--dataset", "multi-turn", "--multi-turn-sessions", "2",
              "--multi-turn-turns", "3", "--multi-turn-system-prompt-len", "48",
              "--multi-turn-tool-output-len", "24", "--multi-turn-output-len", "6",
              "--seed", "303")  # fmt: skip
    check_consistent(r, 6)
    for s in range(2):
        lens = r["input_lens"][3 * s : 3 * s + 3]
        # each turn resends the conversation: + the previous answer and a 24-token message
        assert lens[0] < lens[1] < lens[2] and lens[1] - lens[0] >= 24 + 6
        assert all(c > 0 for c in r["cached_tokens"][3 * s + 1 : 3 * s + 3])
    assert r["prefix_cache_hit_rate"] > 0


def test_offline(tmp_path: Path) -> None:
    out = tmp_path / "offline.json"
    result = CliRunner().invoke(app, ["offline", "--num-prompts", "4", "--input-len", "24",
                                      "--output-len", "5", "--kv-cache-memory", "16MiB",
                                      "--save-result", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Offline benchmark result" in result.output
    r = json.loads(out.read_text())
    assert r["input_lens"] == [24] * 4 and r["output_lens"] == [5] * 4
    assert r["total_output_tokens"] == 20 and r["total_input_tokens"] == 96
    assert r["output_throughput"] == pytest.approx(20 / r["elapsed_s"])
    assert r["request_throughput"] == pytest.approx(4 / r["elapsed_s"])
    assert r["engine_stats"]["ttft_ms"] > 0
    assert r["engine_stats"]["acc_len"] == 1.0  # no drafts: one token per step
    assert [s["output_tokens"] for s in r["request_stats"]] == [5] * 4


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tokenspeed_cli.bench", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def _one_clear_line(proc: subprocess.CompletedProcess[str], expect: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and expect in lines[0], proc.stderr


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--base-url", f"http://127.0.0.1:{free_port()}"], "cannot reach the server"),
        (["--goodput", "latency:5"], "bad --goodput"),
        (["--dataset", "sharegpt", "--dataset-path", "/nonexistent/sg.json"], "not found"),
        (["--base-url", "localhost"], "--base-url must look like"),
    ],
)
def test_user_errors(args: list[str], expect: str) -> None:
    base = [] if "--base-url" in args else ["--base-url", "http://127.0.0.1:9"]
    _one_clear_line(run_cli("serve", *base, "--num-prompts", "2", *args), expect)


def test_wrong_url_and_bad_file_against_the_server(server: Server, tmp_path: Path) -> None:
    proc = run_cli("serve", "--base-url", server.url + "/nothing-here", "--num-prompts", "2")
    _one_clear_line(proc, "not an OpenAI-compatible server")
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": ')
    proc = run_cli("serve", "--base-url", server.url, "--dataset-path", str(bad))
    _one_clear_line(proc, "not valid JSON")
    proc = run_cli("serve", "--base-url", server.url, "--model", "no-such-model",
                   "--num-prompts", "2", "--random-input-len", "8")  # fmt: skip
    _one_clear_line(proc, "does not exist")
