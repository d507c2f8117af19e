"""EOS = config.json ∪ generation_config.json ∪ the tokenizer's EOS (∪ GGUF eos/eot/eom):
a tiny random Llama stops on each listed id; the real SmolLM2 stops where HF generate stops."""
from __future__ import annotations

import json

import pytest
import torch

from inferq.schemas import SamplingParams
from tests.tiny_models import save_tiny_model


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("eos") / "llama", seed=3)


def _llm(folder):
    from inferq.gpuworker import LLM

    torch.set_num_threads(1)
    return LLM(model=str(folder), dtype="float32", num_kv_blocks=64, max_num_batched_tokens=128)


PROMPT = [1, 100, 200, 300, 400]


def test_union_of_config_generation_config_and_tokenizer(tiny_folder, tmp_path):
    from inferq.gpuworker.models.loader import discover_eos_token_ids, load_tokenizer

    tok = load_tokenizer(tiny_folder)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128009, 7]}))
    ids = discover_eos_token_ids(tmp_path, [128001], tok)
    assert ids == [128001, 128009, 7, tok.eos_token_id]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert discover_eos_token_ids(tmp_path, [], tok) == [5, tok.eos_token_id]
    (tmp_path / "generation_config.json").unlink()
    assert discover_eos_token_ids(tmp_path, [tok.eos_token_id], tok) == [tok.eos_token_id]


def test_tiny_llama_stops_on_each_generation_config_eos(tiny_folder, tmp_path):
    import shutil

    base = _llm(tiny_folder)
    free = base.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0].token_ids
    eos0 = base.engine.eos_token_ids
    # Listed ids: tokens the model really emits (not at position 0, and not already EOS).
    listed = [t for t in dict.fromkeys(free[1:]) if t not in eos0][:3]
    assert len(listed) == 3, free
    folder = tmp_path / "with_gen_eos"
    shutil.copytree(tiny_folder, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2] + listed}))
    llm = _llm(folder)
    assert set(listed) <= set(llm.engine.eos_token_ids) and 2 in llm.engine.eos_token_ids
    for t in listed:
        # Listing only this one id (plus the config's 2): the reply ends right at its first occurrence.
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, t]}))
        one = _llm(folder)
        out = one.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0))[0]
        cut = free.index(t) + 1
        if 2 in free[:cut]:
            cut = free.index(2) + 1
        assert out.finish_reason == "stop" and out.token_ids == free[:cut], (t, out.token_ids, free)
        assert out.text == one.tokenizer.decode(free[: cut - 1], skip_special_tokens=True)
    # ignore_eos runs past every listed id; stop_token_ids still stop.
    forced = llm.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
    assert forced.finish_reason == "length" and forced.token_ids == free
    t = listed[-1]
    stopped = llm.generate([PROMPT], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True,
                                                    stop_token_ids=[t]))[0]
    assert stopped.token_ids == free[: free.index(t) + 1] and stopped.finish_reason == "stop"


def test_smollm2_stops_where_hf_generate_stops(smol_llm, hf_smol):
    tok = smol_llm.tokenizer
    assert tok.eos_token_id in smol_llm.engine.eos_token_ids
    for content in ("Say hi.", "What is 2+2? Answer with one number."):
        chat = smol_llm.apply_chat_template([{"role": "user", "content": content}])
        ours = smol_llm.generate([chat], SamplingParams(max_tokens=48, temperature=0))[0]
        with torch.inference_mode():
            hf = hf_smol.generate(torch.tensor([chat]), max_new_tokens=48, do_sample=False,  # HF's own EOS
                                  pad_token_id=tok.pad_token_id)
        theirs = hf[0, len(chat):].tolist()
        assert ours.finish_reason == "stop", (content, ours)
        assert ours.token_ids == theirs, (content, ours.token_ids, theirs)


def test_gguf_eos_eot_and_eom_all_end_a_reply(tmp_path):
    import gguf
    from gguf import GGUFReader

    from inferq.gpuworker.models.gguf_loader import _gguf_eos_ids

    path = tmp_path / "ids.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_eos_token_id(128001)
    w.add_eot_token_id(128009)
    w.add_eom_token_id(128008)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert _gguf_eos_ids(GGUFReader(str(path))) == [128001, 128009, 128008]
