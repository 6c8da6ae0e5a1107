"""Quantized linear weights: checkpoint formats (AWQ, GPTQ, compressed-tensors, FP8) repacked at load into
kernels/quant_formats.py's layouts, on-the-fly quantization of dense checkpoints, and the layers' weights.

Modules: scheme (what a layer holds), checkpoint_config (quantization_config), selection (which applies),
repack_* and checkpoint_stream (checkpoint tensors -> layouts), on_the_fly (dense -> layouts),
quantized_weight (a layer's buffers and matmul), model_build (building and checking a quantized model).
"""
