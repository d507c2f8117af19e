"""The llama.cpp peer benchmarks' own logic: argument handling, the workloads, the
perplexity windows and the parsing of llama.cpp's outputs. The benchmarks themselves
(llama-server, llama-perplexity, a built llama.cpp) are run by hand; see docs/benchmarks.md."""
import os
import struct

import pytest

from inferq.bench import llama_cpp_build, llama_cpp_peer, perplexity


def test_workloads_keep_their_lengths_and_change_their_tokens_per_repeat():
    mixed = llama_cpp_peer.WORKLOADS["mixed"]
    a, b = mixed.requests_for(0), mixed.requests_for(1)
    assert len(a) == 24
    assert [(r.prompt_len, r.output_len) for r in a] == [(r.prompt_len, r.output_len) for r in b]
    assert all(32 <= r.prompt_len <= 384 and 24 <= r.output_len <= 160 and len(r.prompt) == r.prompt_len for r in a)
    assert len({r.prompt_len for r in a}) > 10  # a real mix, not one length
    assert all(x.prompt != y.prompt for x, y in zip(a, b))  # fresh ids: no prefix-cache hits across repeats
    (single,) = llama_cpp_peer.WORKLOADS["single"].requests_for(0)
    assert (single.prompt_len, single.output_len) == (32, 256)
    assert mixed.requests_for(0)[0].prompt == a[0].prompt  # deterministic


def test_peer_arguments():
    args = llama_cpp_peer.parse_args(["--threads", "1,2", "--quants", "q4_1,Q8_0", "--workloads", "mixed"])
    assert args.threads == [1, 2] and args.quants == ["Q4_1", "Q8_0"] and args.workloads == ["mixed"]
    assert args.modes is None  # every mode this checkout has
    args = llama_cpp_peer.parse_args(["--quants", "none", "--synthetic", "llama-8b:Q4_K_M"])
    assert args.quants == [] and args.synthetic == ["llama-8b:Q4_K_M"]
    assert llama_cpp_peer.parse_args([]).single_output == 256
    assert llama_cpp_peer.parse_args(["--single-output", "48"]).single_output == 48
    for bad in (["--quants", "Q9_9"], ["--workloads", "huge"], ["--threads", "0"], ["--repeats", "0"],
                ["--synthetic", "llama-9000:Q4_K_M"], ["--single-output", "1"], ["--synthetic", "llama-8b:IQ1_S"], ["--quants", "none"]):
        with pytest.raises(SystemExit):
            llama_cpp_peer.parse_args(bad)


def test_default_modes_run_the_engine_in_this_cpus_dtype():
    """bf16 where the CPU has bf16 hardware; on an AVX2-only CPU float32 (bf16 would be emulated)."""
    modes = llama_cpp_peer.available_modes()
    want = "bfloat16" if llama_cpp_peer.cpu_has_bf16() else "float32"
    assert modes and all(llama_cpp_peer.OUR_MODES[m][0] == want for m in modes)
    assert llama_cpp_peer.OUR_MODES[modes[0]][1] == "dequantize"
    assert llama_cpp_peer.parse_args(["--modes", "native-fp32,fp32-dequantized"]).modes == ["native-fp32", "fp32-dequantized"]


def test_peer_table_gives_inferq_over_llama_cpp_ratios():
    row = {"threads": 1, "workload": "single", "file": "Q4_1", "mode": "bf16-dequantized",
           "llama_cpp": {"output_tok_s": 100.0, "tpot_ms": 10.0}, "inferq": {"output_tok_s": 50.0, "tpot_ms": 20.0}}
    last = llama_cpp_peer.table([row]).splitlines()[-1]
    assert "| 100.0 | 50.0 | 0.50 | 10.00 | 20.00 | 2.00 |" in last


def test_windows_follow_llama_perplexity():
    tokens = list(range(1000))
    wins = perplexity.windows(tokens, 256)
    assert [w[0] for w in wins] == [0, 256, 512]  # the tail that fills no window is dropped
    assert perplexity.scored_targets(wins[1]) == list(range(256 + 129, 512))  # ctx/2 - 1 per window
    with pytest.raises(ValueError, match="at least 512"):
        perplexity.windows(tokens[:500], 256)
    with pytest.raises(ValueError, match="even"):
        perplexity.windows(tokens, 255)


def test_llama_perplexity_outputs_parse():
    ppl_out = "perplexity: calculating perplexity over 7 chunks\n[1]17.1,[2]17.9,\nFinal estimate: PPL = 17.8812 +/- 0.91234\n"
    assert perplexity.parse_final_ppl(ppl_out) == pytest.approx(17.8812)
    kl_out = ("====== Perplexity statistics ======\nMean PPL(Q)                   :  18.012345 ±   0.912345\n"
              "Mean PPL(base)                :  17.881200 ±   0.900000\n====== KL divergence statistics ======\n"
              "Mean    KLD:   0.012345 ±   0.000456\nMaximum KLD:   0.500000\n"
              "====== Token probability statistics ======\nSame top p: 95.123 ± 0.712 %\n")
    assert perplexity.parse_kl_stats(kl_out) == pytest.approx({"ppl": 18.012345, "kl": 0.012345, "same_top": 0.95123})
    with pytest.raises(ValueError, match="no final PPL"):
        perplexity.parse_final_ppl("llama_model_load: error loading model")


def test_logits_file_head_gives_the_tokens(tmp_path):
    path = tmp_path / "base.logits"
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    path.write_bytes(b"_logits_" + struct.pack("<iii", 4, 49152, 2) + struct.pack("<8i", *tokens) + b"\0" * 64)
    assert perplexity.read_logits_tokens(path) == (4, tokens)
    (tmp_path / "bad").write_bytes(b"GGUF" + b"\0" * 40)
    with pytest.raises(ValueError, match="not a llama-perplexity logits file"):
        perplexity.read_logits_tokens(tmp_path / "bad")


def test_perplexity_arguments(tmp_path):
    args = perplexity.parse_args(["--quants", "q8_0, f16", "--modes", "bf16-dequantized,native"])
    assert args.quant_list == ["Q8_0", "F16"] and args.mode_list == ["bf16-dequantized", "native"]
    assert perplexity.parse_args([]).mode_list is None  # every mode this checkout has
    assert perplexity.DEFAULT_TEXT.is_file() and perplexity.DEFAULT_TEXT.stat().st_size > 4000
    with pytest.raises(SystemExit):
        perplexity.parse_args(["--text", str(tmp_path / "missing.txt")])
    with pytest.raises(SystemExit):
        perplexity.parse_args(["--modes", "fp8"])


def test_tools_folder_is_found_or_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no llama-server"):
        llama_cpp_build.find_tools(str(tmp_path))
    for tool in llama_cpp_build.TOOLS:
        (tmp_path / "build" / "bin").mkdir(parents=True, exist_ok=True)
        exe = tmp_path / "build" / "bin" / tool
        exe.write_text("#!/bin/sh\n")
        os.chmod(exe, 0o755)
    assert llama_cpp_build.find_tools(str(tmp_path)) == tmp_path / "build" / "bin"
    assert llama_cpp_build.cache_dir("9.9").parts[-2:] == ("llama.cpp", "9.9")
