"""Model families, one file each, built from the shared layers in `layers/`.

Every model class has the interface the ModelRunner relies on:

    model = ModelClass(hf_config)                 # transformers PretrainedConfig
    model.load_weights(iterable of (hf_name, tensor))
    hidden = model(input_ids [T], positions [T], kv_caches, meta)   # -> [T, H]
    logits = model.compute_logits(hidden [S, H])                    # -> [S, V] float32
    logits = model.compute_logits(hidden [S, H], widen=False)       # -> [S, V] model dtype (greedy, sampling kernel)
    model.num_layers, model.num_kv_heads, model.head_dim           # KV pool sizing

kv_caches[i] is layer i's slice of the paged pool, [2, num_blocks, block_size, Hkv, D].
"""

from engine.models.registry import MODEL_REGISTRY, resolve_model_class, supported_architectures

__all__ = ["MODEL_REGISTRY", "resolve_model_class", "supported_architectures"]
