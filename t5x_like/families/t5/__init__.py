"""T5 (Raffel et al., 2019): the encoder-decoder network (`network`), its model wrapper
(`model`), the unsupervised objectives of section 3.3 (`preprocessors`, `objectives`), the
text-to-text formats and their postprocessors (`text_to_text`, `postprocessors`) and the
HuggingFace conversion (`hf`)."""
