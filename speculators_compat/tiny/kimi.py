"""The Kimi-K2.5 layout: a DeepSeek-V3 text model inside a multimodal wrapper checkpoint."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from .parts import make_tokenizer, model_config, save_generation_config
from .train import model_of

# Remote-code config classes written next to the weights, as Kimi-K2.5 ships its own
# (`auto_map` in config.json). Written for this fixture; they only hold the two sub-configs.
_CONFIGURATION_PY = '''"""Config of the tiny Kimi-K2.5-shaped fixture (remote code, loaded via auto_map)."""

from transformers import DeepseekV3Config, PretrainedConfig


class KimiK25VisionConfig(PretrainedConfig):
    model_type = "kimi_k25_vision"


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, text_config=None, vision_config=None, media_placeholder_token_id=0, **kwargs):
        text_config = dict(text_config or {})
        text_config.pop("model_type", None)
        self.text_config = DeepseekV3Config(**text_config)
        self.vision_config = KimiK25VisionConfig(**(vision_config or {}))
        self.media_placeholder_token_id = media_placeholder_token_id
        super().__init__(**kwargs)
'''


# Kimi-K2.5 also ships its media processor as remote code, and vLLM loads it (through
# AutoImageProcessor, trust_remote_code) whenever it inspects the model's multimodal support,
# even with every media input limited to 0. This one does what vLLM asks of it: count the
# placeholder tokens of a media chunk, and turn images into patches with their (t, h, w) grid.
_PROCESSOR_PY = '''"""Media processor of the tiny Kimi-K2.5-shaped fixture (remote code, via auto_map)."""

import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


class KimiK25TinyImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, patch_size=14, merge_kernel_size=(2, 2), **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.merge_kernel_size = list(merge_kernel_size)
        self.num_frames_per_chunk = 4  # vLLM >= 0.17 reads it to build dummy video inputs

    def _grid(self, image):
        width, height = image.size
        step_h = self.patch_size * self.merge_kernel_size[0]
        step_w = self.patch_size * self.merge_kernel_size[1]
        h = max(1, height // step_h) * self.merge_kernel_size[0]
        w = max(1, width // step_w) * self.merge_kernel_size[1]
        return 1, h, w

    def _frames(self, chunk):
        if chunk["type"] == "image":
            return [chunk["image"]]
        return list(chunk["video_chunk"])

    def media_tokens_calculator(self, chunk):
        t, h, w = self._grid(self._frames(chunk)[0])
        return t * h * w // (self.merge_kernel_size[0] * self.merge_kernel_size[1])

    def split_video_chunks(self, video):
        n = self.num_frames_per_chunk
        return [list(video[i : i + n]) for i in range(0, len(video), n)]

    def preprocess(self, chunks, **kwargs):
        patches, grids = [], []
        p = self.patch_size
        for chunk in chunks:
            frames = self._frames(chunk)
            t, h, w = self._grid(frames[0])
            for frame in frames[:1]:
                img = frame.convert("RGB").resize((w * p, h * p))
                arr = torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
                arr = arr.reshape(3, h, p, w, p).permute(1, 3, 0, 2, 4).reshape(h * w, 3, p, p)
                patches.append(arr)
            grids.append([t, h, w])
        return BatchFeature(
            {"pixel_values": torch.cat(patches), "grid_thws": torch.tensor(grids)}, tensor_type=None
        )
'''


# Kimi-K2.5's tokenizer is remote code too (tokenization_kimi.py, auto_map in
# tokenizer_config.json), so loading it without trust_remote_code fails, as it does for the
# real checkpoint. This subclass adds nothing but that property.
_TOKENIZER_PY = '''"""Tokenizer of the tiny Kimi-K2.5-shaped fixture (remote code, via auto_map)."""

from transformers import PreTrainedTokenizerFast


class KimiTinyTokenizer(PreTrainedTokenizerFast):
    pass
'''


def _make_tokenizer_remote_code(out: Path) -> None:
    (out / "tokenization_kimi_tiny.py").write_text(_TOKENIZER_PY)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "KimiTinyTokenizer"
    config["auto_map"] = {"AutoTokenizer": ["tokenization_kimi_tiny.KimiTinyTokenizer", None]}
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def build_kimi_k25(recipe: dict, base: dict, dtype: str, out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    wrapper = recipe["wrapper"]
    tokenizer = make_tokenizer(base)
    text = model_config(base, tokenizer, dtype)
    model = model_of({**base, "seed": recipe.get("seed", 0)}, text, tokenizer, out)
    model.to(getattr(torch, dtype))
    # The text model's weights as save_pretrained writes them: the checkpoint layout (one tensor
    # per expert, as the real Kimi-K2.5 ships), not transformers 5's fused in-memory experts.
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        state = {f"language_model.{k}": v for k, v in load_file(str(Path(tmp) / "model.safetensors")).items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    text_dict = text.to_dict()
    text_dict["model_type"] = wrapper["text_model_type"]
    config = {
        "architectures": [recipe["architecture"]],
        "model_type": wrapper["model_type"],
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "text_config": text_dict,
        "vision_config": wrapper["vision_config"],
        "media_placeholder_token_id": tokenizer.convert_tokens_to_ids(wrapper["media_placeholder_token"]),
        "pad_token_id": text.pad_token_id,
        "bos_token_id": text.bos_token_id,
        "eos_token_id": text.eos_token_id,
        "tie_word_embeddings": False,
        "dtype": dtype,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "configuration_kimi_k25.py").write_text(_CONFIGURATION_PY)
    (out / "kimi_k25_processor.py").write_text(_PROCESSOR_PY)
    vision = wrapper["vision_config"]
    preprocessor = {
        "auto_map": {"AutoImageProcessor": "kimi_k25_processor.KimiK25TinyImageProcessor"},
        "image_processor_type": "KimiK25TinyImageProcessor",
        "patch_size": vision["patch_size"],
        "merge_kernel_size": vision["merge_kernel_size"],
        # what vLLM >= 0.32's own processor (KimiK25FusedVisionProcessor) is built from
        "media_proc_cfg": {
            **wrapper["media_proc_cfg"],
            "patch_size": vision["patch_size"],
            "merge_kernel_size": vision["merge_kernel_size"][0],
        },
    }
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2) + "\n")
    tokenizer.save_pretrained(str(out))
    _make_tokenizer_remote_code(out)
    save_generation_config(text, out)
