"""A model's parameters from its Hugging Face ``config.json``, without building it. Owns: for the decoder
architectures in configs/models/ (GPT-2, Llama, OPT, BLOOM, Falcon), every parameter tensor with its element count,
the submodule that owns it, in the order ZeRO-3 fetches submodules in forward (the order their ``forward`` runs),
and the FLOPs and activation bytes of a training step. Does not own: what a step does with them
(plan/step_model/). Pure.

ZeRO-3 gathers parameters per submodule (the module that owns them directly), so a "module" here is one
``nn.Linear``/``nn.Embedding``/norm; a tied output head is the embedding's parameter fetched again by ``lm_head``.
Counts match the models ``transformers`` builds (tests/plan/test_step_model.py checks them against the table in
configs/models/README.md).
"""
import dataclasses
import functools
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..errors import TencacheConfigError


class ModelConfigError(TencacheConfigError):
    """A config.json this module cannot turn into shapes; the message names the file and the key."""


@dataclasses.dataclass(frozen=True)
class Module:
    """One submodule ZeRO-3 fetches: ``params`` are (parameter name, elements); ``matmul`` marks the weights whose
    use is a matrix multiply (2 FLOPs per element per token forward)."""

    name: str
    params: Tuple[Tuple[str, int], ...]
    matmul: bool = False
    layer: int = -1  # transformer block index; -1 outside the blocks


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The modules of one model in forward order (a parameter may appear in two modules: a tied head)."""

    model_type: str
    hidden: int
    layers: int
    heads: int
    vocab: int
    ffn: int
    modules: Tuple[Module, ...]

    def parameters(self) -> Dict[str, int]:
        """Distinct parameters, name -> elements, in first-use order."""
        found: Dict[str, int] = {}
        for module in self.modules:
            for name, numel in module.params:
                found.setdefault(name, numel)
        return found

    @property
    def num_params(self) -> int:
        return sum(self.parameters().values())

    def matmul_elements_per_token(self) -> int:
        """Weight elements multiplied per token in forward (a tied head counts at each use)."""
        return sum(numel for module in self.modules if module.matmul for _name, numel in module.params
                   if not _is_bias(_name))

    def train_flops(self, tokens: int, seq_len: int, checkpointing: bool) -> float:
        """FLOPs of forward + backward over ``tokens`` tokens in sequences of ``seq_len``: 2 per weight element per
        token forward, twice that backward, plus attention scores and their use (4 x seq x hidden per token per
        layer forward); activation checkpointing repeats the forward of the blocks."""
        forward = 2.0 * self.matmul_elements_per_token() * tokens + 4.0 * seq_len * self.hidden * tokens * self.layers
        return forward * (4.0 if checkpointing else 3.0)

    def module_forward_flops(self, module: Module, tokens: int, seq_len: int) -> float:
        """A module's share of the forward FLOPs (attention's score FLOPs charged to the layer's output projection,
        where they happen just before)."""
        flops = 2.0 * sum(numel for name, numel in module.params if not _is_bias(name)) * tokens if module.matmul \
            else 0.0
        if module.name.endswith(ATTENTION_OUTPUT_NAMES):
            flops += 4.0 * seq_len * self.hidden * tokens
        return flops

    def activation_bytes(self, micro_batch: int, seq_len: int, checkpointing: bool, element_bytes: int) -> int:
        """Activations kept for backward, per micro-batch. Per block without checkpointing: ``34 s b h + 5 a s^2 b``
        bytes at 2 bytes per element (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
        Models", 2022, eq. 1), scaled to ``element_bytes``; with checkpointing each block keeps its input
        (``s b h`` elements) and one block is rebuilt at a time. Plus the logits and their gradient in fp32."""
        s, b, h, a = seq_len, micro_batch, self.hidden, self.heads
        per_block = (34 * s * b * h + 5 * a * s * s * b) * element_bytes // 2
        blocks = (self.layers * s * b * h * element_bytes + per_block) if checkpointing else self.layers * per_block
        return int(blocks + 2 * 4 * s * b * self.vocab)


ATTENTION_OUTPUT_NAMES = ("attn.c_proj", "self_attn.o_proj", "self_attn.out_proj", "self_attention.dense")


def _is_bias(name: str) -> bool:
    return name.endswith(".bias")


def layer_count_key(config: Mapping[str, Any]) -> str:
    """The key that holds the number of blocks in this architecture's config."""
    return "n_layer" if config.get("model_type") in ("gpt2", "bloom") else "num_hidden_layers"


def model_shape(config: Mapping[str, Any], source: str = "config") -> ModelShape:
    """Shapes of a Hugging Face config dict. Raises ModelConfigError naming ``source`` and the key for an unknown
    ``model_type`` or a missing/invalid size."""
    model_type = config.get("model_type")
    builder = _BUILDERS.get(model_type) if isinstance(model_type, str) else None  # (a list is no dict key)
    if builder is None:
        raise ModelConfigError(f"{source}: model_type {model_type!r} is not one the estimate knows (key "
                               f"\"model_type\"; known: {', '.join(sorted(_BUILDERS))})")
    return builder(_Reader(config, source))


class _Reader:
    def __init__(self, config: Mapping[str, Any], source: str):
        self.config, self.source = config, source

    def int(self, *keys: str, default: Optional[int] = None) -> int:
        for key in keys:
            value = self.config.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                    raise ModelConfigError(f"{self.source}: key \"{key}\" must be a positive integer, got {value!r}")
                return value
        if default is None:
            raise ModelConfigError(f"{self.source}: missing key \"{keys[0]}\" (a {self.config.get('model_type')} "
                                   f"config needs it)")
        return default

    def flag(self, key: str, default: bool) -> bool:
        value = self.config.get(key, default)
        return default if value is None else bool(value)


def _linear(name: str, out_features: int, in_features: int, bias: bool, layer: int) -> Module:
    params = [(f"{name}.weight", out_features * in_features)]
    if bias:
        params.append((f"{name}.bias", out_features))
    return Module(name, tuple(params), matmul=True, layer=layer)


def _norm(name: str, hidden: int, bias: bool, layer: int = -1) -> Module:
    params = [(f"{name}.weight", hidden)] + ([(f"{name}.bias", hidden)] if bias else [])
    return Module(name, tuple(params), layer=layer)


def _embedding(name: str, rows: int, hidden: int) -> Module:
    return Module(name, ((f"{name}.weight", rows * hidden),))


def _head(embedding: Module, vocab: int, hidden: int, tied: bool) -> Module:
    """The output projection: the embedding's own weight fetched again when tied."""
    if tied:
        return Module("lm_head", embedding.params, matmul=True)
    return Module("lm_head", (("lm_head.weight", vocab * hidden),), matmul=True)


def _gpt2(read: _Reader) -> ModelShape:
    h, n, heads = read.int("n_embd"), read.int("n_layer"), read.int("n_head")
    vocab, positions = read.int("vocab_size"), read.int("n_positions")
    ffn = read.int("n_inner", default=4 * h)
    wte = _embedding("transformer.wte", vocab, h)
    modules: List[Module] = [wte, _embedding("transformer.wpe", positions, h)]
    for i in range(n):
        p = f"transformer.h.{i}"
        modules += [_norm(f"{p}.ln_1", h, True, i), _linear(f"{p}.attn.c_attn", 3 * h, h, True, i),
                    _linear(f"{p}.attn.c_proj", h, h, True, i), _norm(f"{p}.ln_2", h, True, i),
                    _linear(f"{p}.mlp.c_fc", ffn, h, True, i), _linear(f"{p}.mlp.c_proj", h, ffn, True, i)]
    modules += [_norm("transformer.ln_f", h, True), _head(wte, vocab, h, read.flag("tie_word_embeddings", True))]
    return ModelShape("gpt2", h, n, heads, vocab, ffn, tuple(modules))


def _llama(read: _Reader, model_type: str = "llama") -> ModelShape:
    """Llama's layout, which Mistral shares; Qwen2's too, with biases on q, k and v (not o) whatever the config
    says (transformers' Qwen2Attention)."""
    h, n, heads = read.int("hidden_size"), read.int("num_hidden_layers"), read.int("num_attention_heads")
    vocab, ffn = read.int("vocab_size"), read.int("intermediate_size")
    kv = read.int("num_key_value_heads", default=heads)
    head_dim = read.int("head_dim", default=h // heads)
    attn_bias, mlp_bias = read.flag("attention_bias", False), read.flag("mlp_bias", False)
    qkv_bias = attn_bias or model_type == "qwen2"
    embed = _embedding("model.embed_tokens", vocab, h)
    modules: List[Module] = [embed]
    for i in range(n):
        p = f"model.layers.{i}"
        modules += [_norm(f"{p}.input_layernorm", h, False, i),
                    _linear(f"{p}.self_attn.q_proj", heads * head_dim, h, qkv_bias, i),
                    _linear(f"{p}.self_attn.k_proj", kv * head_dim, h, qkv_bias, i),
                    _linear(f"{p}.self_attn.v_proj", kv * head_dim, h, qkv_bias, i),
                    _linear(f"{p}.self_attn.o_proj", h, heads * head_dim, attn_bias, i),
                    _norm(f"{p}.post_attention_layernorm", h, False, i),
                    _linear(f"{p}.mlp.gate_proj", ffn, h, mlp_bias, i),
                    _linear(f"{p}.mlp.up_proj", ffn, h, mlp_bias, i),
                    _linear(f"{p}.mlp.down_proj", h, ffn, mlp_bias, i)]
    modules += [_norm("model.norm", h, False), _head(embed, vocab, h, read.flag("tie_word_embeddings", False))]
    return ModelShape(model_type, h, n, heads, vocab, ffn, tuple(modules))


def _opt(read: _Reader) -> ModelShape:
    h, n, heads = read.int("hidden_size"), read.int("num_hidden_layers"), read.int("num_attention_heads")
    vocab, ffn, positions = read.int("vocab_size"), read.int("ffn_dim"), read.int("max_position_embeddings")
    project = read.int("word_embed_proj_dim", default=h)
    bias = read.flag("enable_bias", True)
    embed = _embedding("model.decoder.embed_tokens", vocab, project)
    modules: List[Module] = [embed, _embedding("model.decoder.embed_positions", positions + 2, h)]
    if project != h:
        modules.append(_linear("model.decoder.project_in", h, project, False, -1))
    for i in range(n):
        p = f"model.decoder.layers.{i}"
        modules += [_norm(f"{p}.self_attn_layer_norm", h, True, i),
                    _linear(f"{p}.self_attn.q_proj", h, h, bias, i), _linear(f"{p}.self_attn.k_proj", h, h, bias, i),
                    _linear(f"{p}.self_attn.v_proj", h, h, bias, i),
                    _linear(f"{p}.self_attn.out_proj", h, h, bias, i),
                    _norm(f"{p}.final_layer_norm", h, True, i),
                    _linear(f"{p}.fc1", ffn, h, bias, i), _linear(f"{p}.fc2", h, ffn, bias, i)]
    if read.flag("do_layer_norm_before", True) and not read.config.get("_remove_final_layer_norm", False):
        modules.append(_norm("model.decoder.final_layer_norm", h, True))
    if project != h:
        modules.append(_linear("model.decoder.project_out", project, h, False, -1))
    modules.append(_head(embed, vocab, project, read.flag("tie_word_embeddings", True)))
    return ModelShape("opt", h, n, heads, vocab, ffn, tuple(modules))


def _bloom(read: _Reader) -> ModelShape:
    h, n, heads, vocab = read.int("hidden_size", "n_embed"), read.int("n_layer"), read.int("n_head"), \
        read.int("vocab_size")
    embed = _embedding("transformer.word_embeddings", vocab, h)
    modules: List[Module] = [embed, _norm("transformer.word_embeddings_layernorm", h, True)]
    for i in range(n):
        p = f"transformer.h.{i}"
        modules += [_norm(f"{p}.input_layernorm", h, True, i),
                    _linear(f"{p}.self_attention.query_key_value", 3 * h, h, True, i),
                    _linear(f"{p}.self_attention.dense", h, h, True, i),
                    _norm(f"{p}.post_attention_layernorm", h, True, i),
                    _linear(f"{p}.mlp.dense_h_to_4h", 4 * h, h, True, i),
                    _linear(f"{p}.mlp.dense_4h_to_h", h, 4 * h, True, i)]
    modules += [_norm("transformer.ln_f", h, True), _head(embed, vocab, h, read.flag("tie_word_embeddings", True))]
    return ModelShape("bloom", h, n, heads, vocab, 4 * h, tuple(modules))


def _falcon(read: _Reader) -> ModelShape:
    h, n, heads, vocab = read.int("hidden_size"), read.int("num_hidden_layers"), read.int("num_attention_heads"), \
        read.int("vocab_size")
    head_dim = h // heads
    new_arch = read.flag("new_decoder_architecture", False)
    if new_arch:
        kv = read.int("num_kv_heads", default=heads)
    else:
        kv = 1 if read.flag("multi_query", True) else heads
    ffn = read.int("ffn_hidden_size", default=4 * h)
    bias = read.flag("bias", False)
    parallel = read.flag("parallel_attn", True)
    norms_in_parallel = read.int("num_ln_in_parallel_attn", default=2) if new_arch else 1
    embed = _embedding("transformer.word_embeddings", vocab, h)
    modules: List[Module] = [embed]
    for i in range(n):
        p = f"transformer.h.{i}"
        if new_arch and norms_in_parallel == 2:
            modules += [_norm(f"{p}.ln_attn", h, True, i), _norm(f"{p}.ln_mlp", h, True, i)]
        else:
            modules.append(_norm(f"{p}.input_layernorm", h, True, i))
        modules += [_linear(f"{p}.self_attention.query_key_value", (heads + 2 * kv) * head_dim, h, bias, i),
                    _linear(f"{p}.self_attention.dense", h, h, bias, i)]
        if not parallel:
            modules.append(_norm(f"{p}.post_attention_layernorm", h, True, i))
        modules += [_linear(f"{p}.mlp.dense_h_to_4h", ffn, h, bias, i),
                    _linear(f"{p}.mlp.dense_4h_to_h", h, ffn, bias, i)]
    modules += [_norm("transformer.ln_f", h, True), _head(embed, vocab, h, read.flag("tie_word_embeddings", True))]
    return ModelShape("falcon", h, n, heads, vocab, ffn, tuple(modules))


_BUILDERS = {"gpt2": _gpt2, "llama": _llama, "mistral": functools.partial(_llama, model_type="mistral"),
             "qwen2": functools.partial(_llama, model_type="qwen2"), "opt": _opt, "bloom": _bloom, "falcon": _falcon}
