"""BERT (Devlin et al., 2018): the encoder and its pretraining heads (`network`), the
fine-tuning and pretraining model wrappers (`model`), the pretraining examples of section 3.1
and appendix A.1 (`pretraining_data`), the tasks' preprocessors and feature converters
(`preprocessors`, `features`), SQuAD's span decoding and evaluation (`squad_spans`,
`squad_eval`) and the HuggingFace conversion (`hf`)."""
