"""Oracle: transformers 4.57.6's loaders of the original checkpoint formats
(`load_tf_weights_in_bert`, `load_tf_weights_in_openai_gpt`, `load_tf_weights_in_t5`), each
filling transformers' PyTorch model, which then runs on the payload's batch.

Payload (one of):
  {"format": "bert", "checkpoint": TF prefix, "config": bert_config.json path,
   "ids": [[int]], "segments": [[int]], "mask": [[int]]}
  {"format": "openai-gpt", "directory": release folder, "config": {OpenAIGPTConfig kwargs},
   "ids": [[int]]}
  {"format": "t5", "checkpoint": TF prefix, "config": {T5Config kwargs}, "inputs": [[int]],
   "decoder_inputs": [[int]]}
  {"format": "bpe", "kind": "gpt2" | "gpt1", "vocab": path, "merges": path, "texts": [str]}

Returns the model's outputs as nested lists: BERT's {"mlm_logits", "nsp_logits", "sequence",
"pooled"}, GPT's {"logits"}, T5's {"encoder", "logits"} (padding: id 0 in `inputs`); for
"bpe", the ids and decoded text of transformers 4's pure-Python GPT2Tokenizer /
OpenAIGPTTokenizer (the latter with BERT's basic tokenizer, as it runs without ftfy and
spaCy): {"ids": [[int]], "decoded": [str]}.
"""

from tests.oracle import oracle_main


def _bert(payload):
    import torch
    import transformers
    from transformers.models.bert.modeling_bert import load_tf_weights_in_bert

    config = transformers.BertConfig.from_json_file(payload["config"])
    model = transformers.BertForPreTraining(config)
    load_tf_weights_in_bert(model, config, payload["checkpoint"])
    model.eval()
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(payload["ids"]),
            token_type_ids=torch.tensor(payload["segments"]),
            attention_mask=torch.tensor(payload["mask"]),
            output_hidden_states=True,
        )
        pooled = model.bert.pooler(out.hidden_states[-1])
    return {
        "mlm_logits": out.prediction_logits.tolist(),
        "nsp_logits": out.seq_relationship_logits.tolist(),
        "sequence": out.hidden_states[-1].tolist(),
        "pooled": pooled.tolist(),
    }


def _openai_gpt(payload):
    import torch
    import transformers
    from transformers.models.openai.modeling_openai import load_tf_weights_in_openai_gpt

    config = transformers.OpenAIGPTConfig(**payload["config"])
    model = transformers.OpenAIGPTLMHeadModel(config)
    load_tf_weights_in_openai_gpt(model.transformer, config, payload["directory"])
    model.tie_weights()
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(payload["ids"])).logits
    return {"logits": logits.tolist()}


def _t5(payload):
    import torch
    import transformers
    from transformers.models.t5.modeling_t5 import load_tf_weights_in_t5

    config = transformers.T5Config(**payload["config"])
    model = transformers.T5ForConditionalGeneration(config)
    load_tf_weights_in_t5(model, config, payload["checkpoint"])
    model.eval()
    inputs = torch.tensor(payload["inputs"])
    with torch.no_grad():
        out = model(
            input_ids=inputs,
            attention_mask=(inputs > 0).long(),
            decoder_input_ids=torch.tensor(payload["decoder_inputs"]),
        )
    return {"encoder": out.encoder_last_hidden_state.tolist(), "logits": out.logits.tolist()}


def _bpe(payload):
    import transformers

    cls = {"gpt2": transformers.GPT2Tokenizer, "gpt1": transformers.OpenAIGPTTokenizer}
    tokenizer = cls[payload["kind"]](payload["vocab"], payload["merges"])
    ids = [tokenizer.encode(text) for text in payload["texts"]]
    return {"ids": ids, "decoded": [tokenizer.decode(i) for i in ids]}


def compute(payload):
    formats = {"bert": _bert, "openai-gpt": _openai_gpt, "t5": _t5, "bpe": _bpe}
    return formats[payload["format"]](payload)


if __name__ == "__main__":
    oracle_main(compute)
