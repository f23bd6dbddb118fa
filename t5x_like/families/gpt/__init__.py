"""GPT-1 (Radford et al., 2018): the decoder-only network and its config (`network`), its
language-model wrapper (`model`), the fine-tuning heads with the auxiliary LM objective
(`finetune`), the task input transformations of section 3.3 (`preprocessors`) and the
HuggingFace conversion (`hf`)."""
