"""Every way a run's state reaches disk and comes back, in one package:

train_state   the train state of each saved step (orbax CheckpointManager, asynchronous
              saves, keep N, manifests of sizes and CRC-32s, restore onto any mesh)
params_io     parameters only (pretrained weights into a fine-tuning run, config checks,
              vocabulary growth) and the orbax front-end every save goes through
best          the best parameters per task during fine-tuning
input_state   where each checkpoint's input position is saved
scan_layout   per-layer <-> scanned (`nn.scan`) parameter layouts
hf_files      reading HuggingFace checkpoint directories (each family's `hf.py` maps them)
hf_families   the registry of those per-family conversions
"""
