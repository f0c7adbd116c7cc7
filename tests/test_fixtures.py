"""The fixture builder and the embedded dataset: deterministic, complete, usable by speculators."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from speculators_compat.tiny import (
    build,
    chat,
    chat_dataset_path,
    list_recipes,
    load_recipe,
)


def _digest(folder: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
    }


def test_recipes_are_listed_and_named_after_their_file():
    names = list_recipes()
    assert {"deepseek-v3-tiny", "llama-tiny", "kimi-k25-tiny"} <= set(names)
    for name in names:
        assert load_recipe(name)["name"] == name


def test_a_variant_recipe_changes_only_what_it_names():
    base, mla = load_recipe("deepseek-v3-tiny"), load_recipe("deepseek-v3-tiny-mla")
    changed = {k for k in base["config"] if base["config"][k] != mla["config"][k]}
    assert changed == {"kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim"}
    assert mla["config"]["kv_lora_rank"] + mla["config"]["qk_rope_head_dim"] == 576  # MLA's latent
    assert {k: v for k, v in mla.items() if k not in ("name", "description", "config")} == {
        k: v for k, v in base.items() if k not in ("name", "description", "config")
    }
    kimi = load_recipe("kimi-k25-tiny-mla")
    assert kimi["base"] == "deepseek-v3-tiny-mla"
    assert kimi["wrapper"] == load_recipe("kimi-k25-tiny")["wrapper"]


def test_unknown_recipe_says_which_exist():
    with pytest.raises(ValueError, match="deepseek-v3-tiny"):
        load_recipe("no-such-model")


@pytest.mark.parametrize("name", ["deepseek-v3-tiny", "llama-tiny", "kimi-k25-tiny"])
def test_builder_is_deterministic(tmp_path, name):
    a = build(name, "float32", out_dir=tmp_path / "a")
    b = build(name, "float32", out_dir=tmp_path / "b")
    digest_a = _digest(a)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(digest_a)
    assert digest_a == _digest(b)


def test_a_build_that_loses_the_race_keeps_the_winners_checkpoint(tmp_path, monkeypatch):
    """Two processes building the same cache key (two tox envs, two preflights): the one that
    finishes second must not remove the folder the first already handed out (a reader may be
    loading it); it keeps that one. Run in one thread: the loser's build runs the winner's whole
    build while it materialises its own copy."""
    import speculators_compat.tiny as tiny

    monkeypatch.setenv("SPECULATORS_COMPAT_CACHE", str(tmp_path))
    materialise = tiny._materialise
    won = []

    def loser(recipe, dtype, out):
        materialise(recipe, dtype, out)
        monkeypatch.setattr(tiny, "_materialise", materialise)
        won.append(build("llama-tiny", "float32"))
        won.append((won[0] / "model.safetensors").stat().st_ino)

    monkeypatch.setattr(tiny, "_materialise", loser)
    path = build("llama-tiny", "float32")
    assert path == won[0]
    assert (path / "model.safetensors").stat().st_ino == won[1], "the winner's checkpoint was replaced"
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name], "a temp folder was left"
    assert build("llama-tiny", "float32", force=True) == path
    assert (path / "model.safetensors").stat().st_ino != won[1], "force rebuilds"


def test_deepseek_fixture_has_kimi_k2_shape(built):
    config = json.loads((built("deepseek-v3-tiny") / "config.json").read_text())
    assert config["architectures"] == ["DeepseekV3ForCausalLM"]
    assert config["topk_method"] == "noaux_tc" and config["scoring_func"] == "sigmoid"
    assert config["first_k_dense_replace"] == 1 and config["n_shared_experts"] == 1
    assert config["q_lora_rank"] and config["kv_lora_rank"]
    # vLLM's CPU backend: attention head size 64, fused-MoE tile a multiple of 64.
    assert config["qk_nope_head_dim"] + config["qk_rope_head_dim"] == 64
    assert (2 * config["moe_intermediate_size"]) % 64 == 0


def test_kimi_fixture_is_laid_out_like_kimi_k25(built):
    from safetensors import safe_open

    path = built("kimi-k25-tiny")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert config["model_type"] == "kimi_k25" and config["text_config"]["model_type"] == "kimi_k2"
    assert config["auto_map"]["AutoConfig"] == "configuration_kimi_k25.KimiK25Config"
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = list(f.keys())  # noqa: SIM118 (safe_open is no dict)
    assert names and all(n.startswith("language_model.") for n in names)
    assert "language_model.model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in names


def test_kimi_config_loads_through_remote_code_as_speculators_loads_it(built):
    """speculators 0.3.0 reads the config with AutoConfig(trust_remote_code=True)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(built("kimi-k25-tiny")), trust_remote_code=True)
    assert config.text_config.num_hidden_layers == 6


def test_bfloat16_variant_stores_bfloat16_weights(built):
    from safetensors import safe_open

    path = built("deepseek-v3-tiny", "bfloat16")
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118 (safe_open is no dict)
    assert dtypes == {"BF16"}


def test_embedded_dataset_is_what_the_generator_makes(tmp_path):
    fresh = chat.write_jsonl(chat.make_conversations(), tmp_path / "chat.jsonl")
    assert fresh.read_bytes() == chat_dataset_path().read_bytes()
    rows = [json.loads(line) for line in fresh.read_text().splitlines()]
    assert len(rows) >= 200
    assert any(sum(t["from"] == "gpt" for t in r["conversations"]) > 1 for r in rows)  # multi-turn


def test_embedded_task_dataset_is_what_the_generator_makes(tmp_path):
    from speculators_compat.tiny import TASKS_DATA, tasks, tasks_dataset_path

    fresh = chat.write_jsonl(
        tasks.make_conversations(TASKS_DATA["n"], TASKS_DATA["seed"]), tmp_path / "t.jsonl"
    )
    assert fresh.read_bytes() == tasks_dataset_path().read_bytes()
    # no prompt of the embedded set is among the trained fixture's training conversations
    spec = load_recipe("deepseek-v3-tiny-trained")["train"]
    trained_on = {
        r["conversations"][0]["value"] for r in tasks.make_conversations(spec["conversations"], spec["seed"])
    }
    rows = [json.loads(line) for line in fresh.read_text().splitlines()]
    held = [r for r in rows if r["conversations"][0]["value"] not in trained_on]
    assert len(held) >= 0.2 * len(rows)  # (a task space this small repeats: "Tell me about X." has 12)


def test_task_answers_follow_from_their_questions():
    from speculators_compat.tiny import tasks

    for row in tasks.make_conversations(200, 7):
        question, answer = (t["value"] for t in row["conversations"])
        if question.startswith("Tell me about "):
            subject = question.removeprefix("Tell me about ").removesuffix(".")
            first, second, number = tasks.facts(subject)
            assert (
                answer.lower().startswith(subject)
                and f"{first} and {second}" in answer
                and str(number) in answer
            )
        elif question.startswith("Count from "):
            start, stop = (int(w) for w in question.removesuffix(".").split()[2::2])
            assert answer == ", ".join(map(str, range(start, stop + 1))) + "."
        elif question.startswith("Repeat after me: "):
            assert answer == question.removeprefix("Repeat after me: ")
        else:
            words = question.removeprefix("How many words are in: ").removesuffix("?").split()
            assert answer == f"There are {len(words)} words: {', '.join(words)}."


def test_a_sharpened_recipe_scales_only_the_query_and_key_projections(built):
    from safetensors.torch import load_file

    plain = load_file(str(built("deepseek-v3-tiny") / "model.safetensors"))
    sharp_recipe = load_recipe("deepseek-v3-tiny-sharp")
    assert sharp_recipe["sharpen"] == 10.0 and sharp_recipe["config"]["rope_scaling"] is None
    sharp = load_file(str(built("deepseek-v3-tiny-sharp") / "model.safetensors"))
    scaled = {k for k in plain if not torch.equal(plain[k], sharp[k])}
    assert scaled == {k for k in plain if k.endswith(("q_b_proj.weight", "kv_a_proj_with_mqa.weight"))}
    for k in scaled:
        assert torch.allclose(sharp[k], 10 * plain[k])


@pytest.mark.parametrize("name", ["deepseek-v3-tiny", "llama-tiny"])
def test_speculators_preprocessing_reads_the_dataset_with_the_fixture_template(built, name, tmp_path):
    """speculators 0.3.0's own preprocessing finds the assistant turns through our chat template."""
    from speculators.data_generation.preprocessing import load_and_preprocess_dataset

    dataset, tokenizer = load_and_preprocess_dataset(
        target_model_path=str(built(name)),
        train_data_path=str(chat_dataset_path()),
        seq_length=512,
        build_dataset_num_proc=1,
        max_samples=20,
        token_freq_path=str(tmp_path / "token_freq.pt"),
        cache_dir=str(tmp_path / "hf-cache"),
    )
    assert len(dataset) == 20
    for row in dataset:
        mask, ids = row["loss_mask"], row["input_ids"]
        assert len(mask) == len(ids) and 0 < int(mask.sum()) < len(ids)
        # Every trained token decodes to assistant text, never to a role marker.
        trained = tokenizer.decode(ids[mask.bool()])
        assert "<|im_" not in trained and "<|start_header_id|>" not in trained
    assert (tmp_path / "token_freq.pt").is_file()


def test_the_committed_trained_weights_are_what_their_recipe_trains(tmp_path):
    """fixtures train remakes deepseek-v3-tiny-trained from its recipe (about 2 minutes on 2
    cores); CPU kernels differ between machines and torch releases, so the new weights are not
    the same bits, but they reach the committed figures: measured 0.9068 top-1 probability and
    0.9222 greedy agreement on torch 2.10 and 2.11 alike (committed: the 2.11 run). On an AMD EPYC
    with AVX-512 (2026-12-07) torch 2.8 reached 0.8839 top-1 probability and torch 2.10 0.8921
    greedy agreement (0.023 and 0.030 off), hence 0.05; the quality floor below stays."""
    from speculators_compat.tiny.train import make_trained, weights_path

    committed = json.loads(weights_path("deepseek-v3-tiny-trained").with_suffix(".json").read_text())
    _, facts = make_trained("deepseek-v3-tiny-trained", tmp_path)
    assert facts["tokenizer"] == committed["tokenizer"]
    assert facts["bigram_agreement"] == committed["bigram_agreement"]  # no training involved
    for key in ("top1_probability", "greedy_agreement"):
        assert abs(facts[key] - committed[key]) <= 0.05, (key, facts[key], committed[key])
    assert facts["top1_probability"] > 0.85 and facts["greedy_agreement"] > facts["bigram_agreement"] + 0.3
