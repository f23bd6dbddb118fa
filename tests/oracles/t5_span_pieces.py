"""Oracle: the T5 library's (t5 0.9.4) span-corruption pieces, function by function
(`t5.data.preprocessors`): `random_spans_helper`, `random_spans_noise_mask` under given
stateless seeds, and `noise_span_to_unique_sentinel` / `nonnoise_span_to_unique_sentinel`.

Payload (every key optional):
  {"helper": [[inputs_length, noise_density, mean_noise_span_length]],
   "masks": [{"length", "noise_density", "mean_noise_span_length", "seeds": [[a, b], [c, d]]}],
   "sentinels": [{"tokens": [int], "noise": [bool], "vocab_size": n}]}

Returns {"helper": [[tokens_length, targets_length]], "masks": [[bool]],
"sentinels": [{"inputs": [int], "targets": [int]}]}. The helper is called as the library's
span-corruption task calls it (one extra token per span on each side).
"""

from tests.oracle import oracle_main


def compute(payload):
    import seqio
    import tensorflow as tf
    from t5.data import preprocessors

    helper = [
        list(
            preprocessors.random_spans_helper(
                inputs_length=n,
                noise_density=density,
                mean_noise_span_length=span,
                extra_tokens_per_span_inputs=1,
                extra_tokens_per_span_targets=1,
            )
        )
        for n, density, span in payload.get("helper", [])
    ]
    masks = [
        preprocessors.random_spans_noise_mask(
            tf.constant(case["length"]),
            case["noise_density"],
            tf.constant(case["seeds"], tf.int32),
            case["mean_noise_span_length"],
        )
        .numpy()
        .tolist()
        for case in payload.get("masks", [])
    ]
    sentinels = []
    for case in payload.get("sentinels", []):
        vocab = seqio.PassThroughVocabulary(size=case["vocab_size"])
        tokens = tf.constant(case["tokens"], tf.int32)
        noise = tf.constant(case["noise"], tf.bool)
        seeds = tf.constant([[0, 0]], tf.int32)  # unused by these two functions
        sentinels.append(
            {
                "inputs": preprocessors.noise_span_to_unique_sentinel(tokens, noise, vocab, seeds)
                .numpy()
                .tolist(),
                "targets": preprocessors.nonnoise_span_to_unique_sentinel(
                    tokens, noise, vocab, seeds
                )
                .numpy()
                .tolist(),
            }
        )
    return {"helper": helper, "masks": masks, "sentinels": sentinels}


if __name__ == "__main__":
    oracle_main(compute)
