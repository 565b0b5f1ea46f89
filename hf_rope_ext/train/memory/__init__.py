"""What one fine-tuning step holds on a device, and the techniques that hold less: the layer inputs that activation
checkpointing keeps, moved to host memory (``offload``); each decoder layer's MLP over tiles of the sequence
(``tiled_mlp``); no needless copies of adapters' inputs and of norms' inputs (``input_casting``, ``lean_norm``); the
bytes a process holds term by term (``model``) and the planner that says which techniques and how many GPUs a row
needs (``planner``).
"""
