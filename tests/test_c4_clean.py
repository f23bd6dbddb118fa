"""Each C4 cleaning rule (T5 paper, section 2.2) removes exactly what it should: hand-made
pages whose expected output is their own good lines, and for the line rules, citation markers,
page rules and bad words also what the code that built C4 keeps (TensorFlow Datasets'
`tensorflow_datasets/text/c4_utils.py`: `clean_page`, `get_badwords_filter_fn`'s pattern).
The reference counts sentences with NLTK's punkt model, which cannot be downloaded here, so
the comparison sets its minimum sentence count to 0 (the page-level sentence rule and the
deduplication are checked by hand below)."""

import gzip
import json

import pytest

from t5x_like.data import c4_clean
from t5x_like.data.c4_clean import C4Cleaner, Page

GOOD = ["The river runs through the old town every spring.",
        "Visitors often walk along its banks at sunset!",
        "Have you ever seen the lanterns on the water?"]


def page(*lines):
    return Page("\n".join(lines), url="u")


@pytest.fixture
def tfds_kept(monkeypatch):
    """The lines TFDS's `c4_utils.clean_page` keeps of a page (None: the page is dropped)."""
    from tensorflow_datasets.text import c4_utils

    # Only the sentence count (set to need 0 sentences) reads the punkt model.
    monkeypatch.setattr(c4_utils, "_get_sentences", lambda text: [text])
    clean = c4_utils.get_clean_page_fn()

    def kept(*lines):
        out = list(clean(c4_utils.PageFeatures(text="\n".join(lines)),
                         counter_inc_fn=lambda *args, **kwargs: None, min_num_sentences=0))
        return out[0].text.splitlines() if out else None

    return kept


def tfds_has_bad_word(text, words):
    """TFDS's bad-words test for an English page: its pattern on the lower-cased text."""
    from tensorflow_datasets.text import c4_utils

    fn = c4_utils.get_badwords_filter_fn({"en": words})
    return fn.keywords["badwords_regex"]["en"].search(text.lower()) is not None


def test_clean_page_passes_through():
    cleaner = C4Cleaner()
    out = cleaner.clean_page(page(*GOOD))
    assert out.text.splitlines() == GOOD
    assert cleaner.report.pages_out == 1 and not cleaner.report.lines_removed


@pytest.mark.parametrize("bad_line,rule", [
    ("This line has no terminal punctuation at all", "terminal_punct"),
    ("Too short a line.", "too_few_words"),
    ("Please enable JavaScript to view this page properly.", "javascript"),
    ("By using this site you agree to our Terms of Use.", "policy"),
    ("We use cookies to improve your experience here.", "policy"),
])
def test_line_rules_remove_only_that_line(bad_line, rule, tfds_kept):
    cleaner = C4Cleaner()
    out = cleaner.clean_page(page(GOOD[0], bad_line, GOOD[1], GOOD[2]))
    assert out.text.splitlines() == GOOD == tfds_kept(GOOD[0], bad_line, GOOD[1], GOOD[2])
    assert cleaner.report.lines_removed == {rule: 1}


def test_closing_quote_counts_as_terminal_punctuation(tfds_kept):
    quoted = 'She said that the lanterns were "beautiful tonight."'
    out = C4Cleaner().clean_page(page(quoted, *GOOD))
    assert out.text.splitlines()[0] == quoted
    assert out.text.splitlines() == tfds_kept(quoted, *GOOD)


def test_citation_markers_are_cut_out(tfds_kept):
    line = "The bridge was built in 1820 [1] by local masons [citation needed]."
    out = C4Cleaner().clean_page(page(line, *GOOD))
    # By hand: the markers go, the spaces around them stay.
    assert out.text.splitlines()[0] == "The bridge was built in 1820  by local masons ."
    assert out.text.splitlines() == tfds_kept(line, *GOOD)


@pytest.mark.parametrize("extra,rule", [
    ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "lorem_ipsum"),
    ("The function body is { return x; } in this example.", "curly_brace"),
    ("This sentence contains the word grapefruit somewhere inside.", "bad_words"),
])
def test_page_rules_remove_the_whole_page(extra, rule, tfds_kept):
    words = ["grapefruit", "two words"]
    cleaner = C4Cleaner(bad_words=words)
    assert cleaner.clean_page(page(*GOOD, extra)) is None
    assert cleaner.report.pages_removed == {rule: 1}
    text = "\n".join([*GOOD, extra])
    if rule == "bad_words":  # a filter of its own in TFDS, after clean_page
        assert tfds_has_bad_word(text, words)
    else:
        assert tfds_kept(*GOOD, extra) is None


def test_bad_words_match_whole_words_and_phrases_only():
    words = ["ass", "two words"]
    cleaner = C4Cleaner(bad_words=words)
    for line, dropped in (("The class passed the assessment with ease.", False),
                          ("There are Two Words hidden in this line.", True)):
        assert (cleaner.clean_page(page(*GOOD, line)) is None) == dropped
        assert tfds_has_bad_word("\n".join([*GOOD, line]), words) == dropped
    assert cleaner.report.pages_removed == {"bad_words": 1}


def test_without_a_bad_words_list_the_rule_says_it_was_skipped():
    assert "bad_words" in C4Cleaner().report.table()


def test_pages_with_fewer_than_three_sentences():
    cleaner = C4Cleaner()
    assert cleaner.clean_page(page(GOOD[0], GOOD[1])) is None
    # Three sentences on one line are enough.
    assert cleaner.clean_page(page(" ".join(GOOD))) is not None
    assert cleaner.report.pages_removed == {"too_few_sentences": 1}


def test_language_filter():
    cleaner = C4Cleaner(language_filter=lambda text: "river" in text)
    assert cleaner.clean_page(page(*GOOD)) is not None
    other = ["Der Fluss fließt jeden Frühling durch die Altstadt.",
             "Besucher gehen oft bei Sonnenuntergang am Ufer spazieren.",
             "Haben Sie jemals die Laternen auf dem Wasser gesehen?"]
    assert cleaner.clean_page(page(*other)) is None
    assert cleaner.report.pages_removed == {"language": 1}


def test_three_sentence_spans_are_deduplicated_keeping_the_first():
    fresh = ["A second page starts with its very own sentence.",
             "It then goes on to say something else entirely.",
             "Finally it ends in a completely original way."]
    cleaner = C4Cleaner()
    first = cleaner.clean_page(page(*GOOD))
    second = cleaner.clean_page(page(*fresh, *GOOD))
    assert first.text.splitlines() == GOOD
    assert second.text.splitlines() == fresh  # the repeated span is gone, the rest stays
    assert cleaner.report.spans_removed == 1
    # A page that is nothing but a seen span loses all its sentences, then the page.
    assert cleaner.clean_page(page(*GOOD)) is None
    assert cleaner.report.pages_removed == {"duplicate_spans": 1}
    # Two sentences in common are not a three-sentence span.
    partial = cleaner.clean_page(page(GOOD[0], GOOD[1], "But this third one is new here."))
    assert partial is not None and cleaner.report.spans_removed == 2


def test_command_line_reads_jsonl_and_txt_and_writes_c4_layout(tmp_path, capsys):
    with gzip.open(tmp_path / "crawl.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "\n".join(GOOD), "url": "a", "timestamp": "t"}) + "\n")
        f.write(json.dumps({"text": "lorem ipsum.", "url": "b"}) + "\n")
    (tmp_path / "page.txt").write_text("\n".join(GOOD[::-1]) + "\nno punctuation here")
    (tmp_path / "words.txt").write_text("grapefruit\n")
    out = tmp_path / "clean" / "c4-train.00000-of-00001.json.gz"
    report = c4_clean.main(["--input", str(tmp_path / "*.jsonl.gz"),
                            "--input", str(tmp_path / "page.txt"), "--output", str(out),
                            "--bad_words_file", str(tmp_path / "words.txt")])
    with gzip.open(out, "rt") as f:
        records = [json.loads(l) for l in f]
    assert records[0] == {"text": "\n".join(GOOD), "url": "a", "timestamp": "t"}
    assert records[1]["text"] == "\n".join(GOOD[::-1])
    assert report.pages_removed == {"lorem_ipsum": 1}
    assert report.lines_removed == {"terminal_punct": 1}
    assert "pages removed by lorem_ipsum" in capsys.readouterr().out
