"""The model families, one package each: everything that knows a family lives here.

Each family package holds its config and network, the model wrapper the trainer drives (a
`t5x_like.models.base.Model`), its data pieces and its HuggingFace conversion, and registers
itself when imported: the config class with `ModelConfig`'s family registry (so a checkpoint's
`config.json` finds it) and the conversion with `checkpoints.hf_families`. The core (trainer,
data pipeline, checkpoints, evaluation, decoding, runtime) imports none of these packages;
the entry points' gin registration (`t5x_like.gin_setup`) imports all of them.

  t5    encoder-decoder text-to-text (Raffel et al., 2019)
  bert  bidirectional encoder, masked LM + next sentence prediction (Devlin et al., 2018)
  gpt   decoder-only language model with fine-tuning heads (Radford et al., 2018)
"""
