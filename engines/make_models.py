"""Make fairlib's tiny random-weight test models: a Hugging Face Llama folder (vLLM) and a GGUF
(llama.cpp), from one seeded set of weights and one vocabulary.

No model hub is reachable and none is needed: timing, not text, matters. Needs only numpy,
safetensors, tokenizers and gguf (``engines/setup_models.sh`` installs them in
``.engines/tools-venv``); torch and transformers are not used (when transformers is importable the
folder is loaded back with it as a check).

Exact output lengths: the model cannot sample end-of-sequence, control, unknown or byte tokens.
Column 0 of the token embedding is a constant (``ANCHOR``) and no layer writes to it (the rows of
``o_proj``/``down_proj`` for that column are zero), so after the final RMSNorm that coordinate is
always large and positive; those tokens have a strongly negative output weight on it (and every
other token zero there). Every generated token is then a whole ASCII piece: one SSE chunk per
token on every server, and ``max_tokens`` is always reached, with or without ``ignore_eos``.

Both files share the token ids: 0 ``<unk>``, 1 ``<s>``, 2 ``</s>``, 3..258 byte tokens
``<0x00>``..``<0xFF>``, then normal pieces (``▁`` marks a word start). ``fairlib.calibrate.lifecycle``'s
``ModelTokenizer`` reads ``tokenizer.json`` to build exact-length token-id prompts.

Usage: python engines/make_models.py [--out .engines/models] [--seed 0] [--layers 4]
       [--hidden 512] [--vocab 8192] [--force]
Writes OUT/NAME/ (config.json, model.safetensors, tokenizer.json, tokenizer_config.json,
special_tokens_map.json, generation_config.json, fairlib_model.json) and OUT/NAME.gguf (f16),
NAME = tiny-llama-<layers>l-<hidden>h-<vocab>v-s<seed>. Idempotent: skipped when
fairlib_model.json records the same parameters and generator version (``--force`` rewrites).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import string
import sys
import time
from pathlib import Path

import numpy as np

GENERATOR_VERSION = 1
ANCHOR = 4.0          # the constant embedding column
BANNED_WEIGHT = -8.0  # output weight of banned tokens on that column (logit ~ -8 * h[0])
INIT_STD = 0.02
SPECIALS = ("<unk>", "<s>", "</s>")
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# Words for whole-word pieces: the measurement client's prompt words first (the file
# fairlib/client/schedule.py reads; read here as text so this script runs without fairlib installed).
WORDS = (Path(__file__).resolve().parent.parent / "fairlib" / "client" / "words.txt").read_text().split() + """
req the of and to in is it you that he was for on are with as his they be
at one have this from or had by not but what some we can out other were all there when
up your how said an each she which do their if will about many then them these so would make
like him into has look two more write go see no could been call who its now find long down
did get come made may
""".split()


def build_vocab(vocab_size: int, seed: int) -> list:
    """[(piece, score, kind)] with kind in {unk, control, byte, normal}; ids are list positions."""
    out = [("<unk>", 0.0, "unk"), ("<s>", 0.0, "control"), ("</s>", 0.0, "control")]
    out += [(f"<0x{b:02X}>", 0.0, "byte") for b in range(256)]
    seen = {p for p, _, _ in out}
    normal: list = []

    def add(piece):
        if piece not in seen:
            seen.add(piece)
            normal.append(piece)

    chars = string.ascii_lowercase + string.ascii_uppercase + string.digits + string.punctuation
    add("\u2581")
    for c in chars:
        add(c)
    for c in chars:
        add("\u2581" + c)
    for w in WORDS:  # every prefix of "▁word": SentencePiece-style merging reaches the whole word
        p = "\u2581" + w
        for k in range(2, len(p) + 1):
            add(p[:k])
    rng = np.random.default_rng([seed, 1])
    letters = np.array(list(string.ascii_lowercase))
    for a in string.ascii_lowercase:
        for b in string.ascii_lowercase:
            add(a + b)
    while len(out) + len(normal) < vocab_size:
        k = int(rng.integers(3, 7))
        s = "".join(rng.choice(letters, size=k))
        add(("\u2581" + s) if rng.random() < 0.5 else s)
    normal = normal[: vocab_size - len(out)]
    # Longer pieces score higher (fewer, longer pieces win in both Unigram and SPM merging).
    out += [(p, -10.0 + 0.5 * len(p) - 1e-4 * i, "normal") for i, p in enumerate(normal)]
    assert len(out) == vocab_size and len({p for p, _, _ in out}) == vocab_size
    return out


def make_weights(cfg: dict, vocab: list, seed: int) -> dict:
    """HF-named float32 weights (the anchor trick applied)."""
    rng = np.random.default_rng([seed, 0])
    h, f, L, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    hd = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd

    def randn(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * INIT_STD).astype(np.float32)

    w = {}
    emb = randn(V, h)
    emb[:, 0] = ANCHOR
    w["model.embed_tokens.weight"] = emb
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        w[p + "self_attn.q_proj.weight"] = randn(h, h)
        w[p + "self_attn.k_proj.weight"] = randn(kv, h)
        w[p + "self_attn.v_proj.weight"] = randn(kv, h)
        o = randn(h, h)
        o[0, :] = 0.0  # nothing writes to the anchor column
        w[p + "self_attn.o_proj.weight"] = o
        w[p + "mlp.gate_proj.weight"] = randn(f, h)
        w[p + "mlp.up_proj.weight"] = randn(f, h)
        d = randn(h, f)
        d[0, :] = 0.0
        w[p + "mlp.down_proj.weight"] = d
    w["model.norm.weight"] = np.ones(h, np.float32)
    head = randn(V, h)
    head[:, 0] = 0.0
    banned = [i for i, (_, _, kind) in enumerate(vocab) if kind != "normal"]
    head[banned, 0] = BANNED_WEIGHT
    w["lm_head.weight"] = head
    return w


def check_banned(w: dict, cfg: dict, vocab: list) -> float:
    """Worst-case margin: min over a few random residual streams of (best normal - best banned) logit."""
    h = cfg["hidden_size"]
    rng = np.random.default_rng(123)
    head = w["lm_head.weight"]
    banned = np.array([k != "normal" for _, _, k in vocab])
    worst = np.inf
    for _ in range(64):
        x = rng.standard_normal(h).astype(np.float32) * 0.5  # residual far noisier than the model's
        x[0] = ANCHOR
        y = x / np.sqrt(np.mean(x * x) + cfg["rms_norm_eps"])
        logits = head @ y
        worst = min(worst, logits[~banned].max() - logits[banned].max())
    return float(worst)


def hf_config(layers, hidden, vocab_size, heads, kv_heads, ffn, ctx) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": ctx,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": INIT_STD,
        "vocab_size": vocab_size,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        "torch_dtype": "float16",
        "use_cache": True,
    }


def write_tokenizer(folder: Path, vocab: list, ctx: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.Unigram([(p, s) for p, s, _ in vocab], unk_id=0, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    from tokenizers import AddedToken
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "pad_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ctx,
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2) + "\n")


def write_hf(folder: Path, cfg: dict, w: dict, vocab: list) -> None:
    from safetensors.numpy import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    # No sampling defaults of our own: the engines' defaults (and each request's settings) apply.
    gen = {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True}
    (folder / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    save_file({k: v.astype(np.float16) for k, v in w.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    write_tokenizer(folder, vocab, cfg["max_position_embeddings"])


def _permute_qk(x: np.ndarray, n_head: int) -> np.ndarray:
    """HF (rotate-half) to GGUF (interleaved) row order, as llama.cpp's convert_hf_to_gguf does."""
    return (x.reshape(n_head, 2, x.shape[0] // n_head // 2, *x.shape[1:])
            .swapaxes(1, 2).reshape(x.shape))


def write_gguf(path: Path, name: str, cfg: dict, w: dict, vocab: list) -> None:
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".gguf.tmp")
    wr = gguf.GGUFWriter(str(tmp), "llama")
    wr.add_name(name)
    wr.add_context_length(cfg["max_position_embeddings"])
    wr.add_embedding_length(cfg["hidden_size"])
    wr.add_block_count(cfg["num_hidden_layers"])
    wr.add_feed_forward_length(cfg["intermediate_size"])
    wr.add_head_count(cfg["num_attention_heads"])
    wr.add_head_count_kv(cfg["num_key_value_heads"])
    wr.add_rope_dimension_count(cfg["head_dim"])
    wr.add_rope_freq_base(cfg["rope_theta"])
    wr.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    wr.add_vocab_size(cfg["vocab_size"])
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    types = {"normal": gguf.TokenType.NORMAL, "unk": gguf.TokenType.UNKNOWN,
             "control": gguf.TokenType.CONTROL, "byte": gguf.TokenType.BYTE}
    wr.add_tokenizer_model("llama")
    wr.add_tokenizer_pre("default")
    wr.add_token_list([p.encode("utf-8") for p, _, _ in vocab])
    wr.add_token_scores([float(s) for _, s, _ in vocab])
    wr.add_token_types([int(types[k]) for _, _, k in vocab])
    wr.add_unk_token_id(0)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_add_bos_token(False)
    wr.add_add_eos_token(False)
    wr.add_chat_template(CHAT_TEMPLATE)
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def f16(a):
        return np.ascontiguousarray(a.astype(np.float16))

    def f32(a):
        return np.ascontiguousarray(a.astype(np.float32))

    wr.add_tensor("token_embd.weight", f16(w["model.embed_tokens.weight"]))
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        wr.add_tensor(b + "attn_norm.weight", f32(w[p + "input_layernorm.weight"]))
        wr.add_tensor(b + "attn_q.weight", f16(_permute_qk(w[p + "self_attn.q_proj.weight"], nh)))
        wr.add_tensor(b + "attn_k.weight", f16(_permute_qk(w[p + "self_attn.k_proj.weight"], nkv)))
        wr.add_tensor(b + "attn_v.weight", f16(w[p + "self_attn.v_proj.weight"]))
        wr.add_tensor(b + "attn_output.weight", f16(w[p + "self_attn.o_proj.weight"]))
        wr.add_tensor(b + "ffn_norm.weight", f32(w[p + "post_attention_layernorm.weight"]))
        wr.add_tensor(b + "ffn_gate.weight", f16(w[p + "mlp.gate_proj.weight"]))
        wr.add_tensor(b + "ffn_up.weight", f16(w[p + "mlp.up_proj.weight"]))
        wr.add_tensor(b + "ffn_down.weight", f16(w[p + "mlp.down_proj.weight"]))
    wr.add_tensor("output_norm.weight", f32(w["model.norm.weight"]))
    wr.add_tensor("output.weight", f16(w["lm_head.weight"]))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, path)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_with_transformers(folder: Path) -> str:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers not installed here: load check skipped"
    from transformers import AutoConfig, AutoTokenizer
    AutoConfig.from_pretrained(str(folder))
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template([{"role": "user", "content": "hello world"}], add_generation_prompt=True,
                                  tokenize=True)
    return f"transformers loads it ({type(tok).__name__}; chat prompt {len(ids)} tokens)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / ".engines" / "models"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--ffn", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=4096, help="max_position_embeddings / GGUF context length")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args(argv)

    name = f"tiny-llama-{a.layers}l-{a.hidden}h-{a.vocab}v-s{a.seed}"
    out = Path(a.out)
    folder, gguf_path = out / name, out / f"{name}.gguf"
    params = {"generator_version": GENERATOR_VERSION, "seed": a.seed, "layers": a.layers,
              "hidden": a.hidden, "heads": a.heads, "kv_heads": a.kv_heads, "ffn": a.ffn,
              "vocab": a.vocab, "ctx": a.ctx}
    meta_path = folder / "fairlib_model.json"
    if not a.force and meta_path.exists() and gguf_path.exists():
        try:
            old = json.loads(meta_path.read_text())
        except ValueError:
            old = {}
        if old.get("params") == params:
            print(f"make_models: cached ({folder}, {gguf_path})")
            return 0
    t0 = time.perf_counter()
    cfg = hf_config(a.layers, a.hidden, a.vocab, a.heads, a.kv_heads, a.ffn, a.ctx)
    vocab = build_vocab(a.vocab, a.seed)
    w = make_weights(cfg, vocab, a.seed)
    margin = check_banned(w, cfg, vocab)
    if margin < 20:
        print(f"make_models: banned-token margin only {margin:.1f}", file=sys.stderr)
        return 1
    if meta_path.exists():
        meta_path.unlink()
    write_hf(folder, cfg, w, vocab)
    t1 = time.perf_counter()
    write_gguf(gguf_path, name, cfg, w, vocab)
    t2 = time.perf_counter()
    n_params = int(sum(v.size for v in w.values()))
    meta = {"name": name, "params": params, "n_params": n_params, "banned_logit_margin": margin,
            "n_banned_tokens": sum(k != "normal" for _, _, k in vocab),
            "hf_folder": str(folder), "gguf": str(gguf_path),
            "gguf_sha256": _sha256(gguf_path),
            "safetensors_sha256": _sha256(folder / "model.safetensors")}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"make_models: {name}: {n_params / 1e6:.1f} M parameters, banned-token logit margin "
          f">= {margin:.0f}; HF folder {t1 - t0:.1f} s, GGUF {t2 - t1:.1f} s "
          f"({gguf_path.stat().st_size / 2**20:.0f} MiB)")
    print("make_models: " + _check_with_transformers(folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
