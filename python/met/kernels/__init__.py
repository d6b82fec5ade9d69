"""met's own GPU kernels and CUDA runtime pieces, wrapped for torch tensors.

cuda_ops: the kernels of csrc/kernels; cuda_streams: the decode/prefill streams and the event;
cuda_graphs: decode forwards captured per batch size. Importing these modules never touches the
GPU; calling into them needs `available()`.
"""
