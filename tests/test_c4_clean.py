"""C4 cleaning against the code that built C4: TensorFlow Datasets' `c4.py` pipeline, run from
its own per-page functions in `tensorflow_datasets/text/c4_utils.py` (`is_valid_length`,
`select_newest_page`, `clean_page`, `_emit_url_to_lines`, `_remove_lines_from_text`,
`get_badwords_filter_fn`). Only Apache Beam's glue between them is written here (group by
key, `Top.PerKey(1, key=_hash_text, reverse=True)` = the smallest hash), since Beam is not
installed. TFDS counts sentences with NLTK's punkt model, which cannot be downloaded here, so
both sides are given the same splitter: ours, and NLTK's untrained punkt.

`--rules paper` (section 2.2's wording) is checked by hand-made pages whose expected output
is their own good lines."""

import collections
import gzip
import hashlib
import json
import random

import pytest

from t5x_like.data import c4_clean
from t5x_like.data.c4_clean import C4Cleaner, Page, PaperWordingCleaner

GOOD = [
    "The river runs through the old town every spring.",
    "Visitors often walk along its banks at sunset!",
    "Have you ever seen the lanterns on the water?",
]


def page(*lines, url="u", timestamp=""):
    return Page("\n".join(lines), url=url, timestamp=timestamp)


def clean(*pages, **kwargs):
    cleaner = C4Cleaner(**kwargs)
    return [p.text.splitlines() for p in cleaner.clean(pages)], cleaner.report


# --------------------------------------------------------------------- the oracle
def write_wet(path, pages) -> None:
    """`pages` as a Common Crawl WET file (WARC/1.0 records of extracted text)."""
    with gzip.open(path, "wt", encoding="utf-8", newline="") as f:
        for p in pages:
            f.write(
                f"WARC/1.0\r\nWARC-Type: conversion\r\nWARC-Target-URI: {p.url}\r\n"
                f"WARC-Date: {p.timestamp}\r\nContent-Type: text/plain\r\n"
                f"Content-Length: {len(p.text.encode())}\r\n\r\n{p.text}\r\n\r\n"
            )


@pytest.fixture
def tfds_c4(monkeypatch, tmp_path):
    """TFDS's C4 pipeline over `pages` (langdetect aside), with a given sentence splitter: the
    pages are written as a WET file and read by TFDS's own reader."""
    from tensorflow_datasets.text import c4_utils

    noop = lambda *args, **kwargs: None  # noqa: E731  (Beam's metrics counters)
    monkeypatch.setattr(c4_utils, "get_counter_inc_fn", lambda namespace: noop)

    def run(pages, bad_words=(), sentences=c4_clean.split_sentences):
        monkeypatch.setattr(c4_utils, "_get_sentences", lambda text: list(sentences(text)))
        wet = str(tmp_path / "pages.warc.wet.gz")
        write_wet(wet, pages)
        features = list(c4_utils.split_wet_file(wet, counter_inc_fn=noop))
        features = [p for p in features if c4_utils.is_valid_length(p)]
        by_url = collections.defaultdict(list)
        for p in features:
            by_url[p.normalized_url].append(p)
        features = [c4_utils.select_newest_page(group) for group in by_url.values()]
        clean_page = c4_utils.get_clean_page_fn()
        features = [q for p in features for q in clean_page(p, counter_inc_fn=noop)]
        selected = {}
        for p in features:
            for line_hash, url in c4_utils._emit_url_to_lines(p):
                best = selected.get(line_hash, url)
                selected[line_hash] = min(best, url, key=c4_utils._hash_text)
        lines_to_keep = collections.defaultdict(list)
        for line_hash, url in selected.items():
            lines_to_keep[url].append(line_hash)
        features = [
            q
            for p in features
            for q in c4_utils._remove_lines_from_text(
                (p.url, {"pages": [p], "lines": lines_to_keep[p.url]}), noop, 3
            )
        ]
        if bad_words:
            keep = c4_utils.get_badwords_filter_fn({"en": list(bad_words)})
            features = [
                p
                for p in features
                if keep(c4_utils.PageFeatures(url=p.url, text=p.text, language="en"))
            ]
        return [(p.url, p.text) for p in features]

    return run


def random_pages(rng: random.Random, n: int) -> list[Page]:
    """Pages built to meet every rule: shared lines, URL variants, marks, long words."""
    words = "the a river town spring bank sunset lantern water old bridge mason city".split()

    def sentence():
        return " ".join(
            rng.choice(words) for _ in range(rng.randint(2, 9))
        ).capitalize() + rng.choice([".", ".", "!", "?", '."', "...", "”", ""])

    shared = [" ".join(sentence() for _ in range(rng.randint(1, 3))) for _ in range(12)]
    specials = [
        "See the old bridge [1] built by masons [edit] in the town.",
        "[2] The bridge is very old and the river is wide.",
        "Old towns [Citation Needed] keep their bridges for a long time.",
        "A line with a " + "w" * 1001 + " word in it ends here.",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit.",
        "lorem ipsum",
        "Please enable javascript { to see } this page properly.",
        "The function body is { return x; } in this example.",
        "By using this site you agree to our Terms of Use.",
        "Our site uses cookies to give you the best experience.",
        "Here is a grapefruit in the middle of sentence <n>.",  # <n>: unique to the page,
        "Two Words are hidden in line <n> of this text, said he.",  # so not de-duplicated
        "   Spaces surround this line of text on both its sides.   ",
        "The line ends in an ellipsis and that is all...",
        "Content-wise the old town is a lovely place to visit.",
        "\tIndented with a tab, this line of text is still good.",
        "",
    ]
    hosts = [
        "http://a.org/x",
        "https://www.a.org/x",
        "https://a.org/x/",
        "a.org/x?utm_s=1",
        "http://b.org/page",
        "https://b.org/page?ref=z",
    ]
    pages = []
    for i in range(n):
        lines = []
        for _ in range(rng.randint(0, 8)):
            r = rng.random()
            lines.append(
                rng.choice(shared)
                if r < 0.35
                else rng.choice(specials).replace("<n>", str(i))
                if r < 0.55
                else " ".join(sentence() for _ in range(rng.randint(1, 4)))
            )
        text = rng.choice(["\n", "\r\n", "\n\n", "\r"]).join(lines)
        if rng.random() < 0.01:
            text += "\n" + "A very long page. " * 11_000
        if rng.random() < 0.01:  # long in raw characters only: the reader drops blank lines
            text += "\n" * 200_000
        url = rng.choice(hosts) if rng.random() < 0.15 else f"https://site{i % 50}.com/{i}"
        pages.append(Page(text, url=url, timestamp=f"2019-04-{rng.randint(10, 28)}"))
    return pages


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("splitter", ["regex", "untrained_punkt"])
def test_equals_tfds_c4_pipeline(seed, splitter, tfds_c4):
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    sentences = (
        c4_clean.split_sentences if splitter == "regex" else PunktSentenceTokenizer().tokenize
    )
    pages = random_pages(random.Random(seed), 300)
    bad_words = ["grapefruit", "two words"]
    cleaner = C4Cleaner(bad_words=bad_words, sentence_splitter=sentences)
    ours = [(p.url, p.text) for p in cleaner.clean(pages)]
    reference = tfds_c4(pages, bad_words, sentences)
    assert sorted(ours) == sorted(reference)
    assert len(ours) > 30  # the corpus keeps enough pages to be a real comparison
    removed = cleaner.report.pages_removed
    for rule in (
        "empty_page",
        "duplicate_url",
        "lorem_ipsum",
        "curly_brace",
        "too_few_sentences",
        "duplicate_lines",
        "bad_words",
    ):
        assert removed[rule] > 0, rule  # every page rule is met
    for rule in (
        "long_word",
        "terminal_punct",
        "too_few_words",
        "javascript",
        "policy",
        "duplicate_line",
    ):
        assert cleaner.report.lines_removed[rule] > 0, rule
    assert cleaner.report.pages_in - cleaner.report.pages_out == sum(removed.values())


def test_a_cut_citation_leaves_its_space_except_at_the_page_start(tfds_c4):
    lines = [
        "[1] The bridge was built by local masons long ago.",
        "[2] The river under it is wide and slow in summer.",
        *GOOD,
    ]
    kept, _ = clean(page(*lines))
    assert kept == [[lines[0][4:], lines[1][3:], *GOOD]]  # by hand: TFDS strips the page
    assert [("u", "\n".join(kept[0]))] == tfds_c4([page(*lines, timestamp="2019-04-01")])


def test_url_normalization_equals_tfds():
    from tensorflow_datasets.text import c4_utils

    for url in [
        "http://www.a.org/x/",
        "https://a.org/x?utm_source=t",
        "a.org/x?ref=1&b=2",
        "https://www.b.org/feed?feed=1",
        "https://c.org/?q=utm_",
        "ftp://d.org//",
    ]:
        assert c4_clean.normalize_url(url) == c4_utils.normalize_url(url)


# ------------------------------------------------------------ TFDS rules by hand
@pytest.mark.parametrize(
    "bad_line,rule",
    [
        ("This line has no terminal punctuation at all", "terminal_punct"),
        ("This line trails off into an ellipsis...", "terminal_punct"),
        ("This line ends in a curly closing quote ”", "terminal_punct"),
        ("Too short a line.", "too_few_words"),
        ("A " + "x" * 1001 + " word is too long for any line.", "long_word"),
        ("Please enable JavaScript to view this page properly.", "javascript"),
        ("By using this site you agree to our Terms of Use.", "policy"),
        ("We use cookies to improve your experience here.", "policy"),
    ],
)
def test_line_rules_remove_only_that_line(bad_line, rule):
    kept, report = clean(page(GOOD[0], bad_line, GOOD[1], GOOD[2]))
    assert kept == [GOOD]
    assert report.lines_removed == {rule: 1}


def test_citation_markers_are_cut_out_in_lower_case_only():
    line = "The bridge was built in 1820 [1] by local masons [citation needed]."
    upper = "The bridge was built in 1820 by local masons [Citation Needed]."
    kept, _ = clean(page(line, upper, *GOOD))
    # By hand: the markers go, the spaces around them stay; TFDS's pattern has no IGNORECASE.
    assert kept[0][:2] == ["The bridge was built in 1820  by local masons .", upper]


@pytest.mark.parametrize(
    "extra,rule",
    [
        ("Lorem ipsum dolor sit amet, consectetur adipiscing elit.", "lorem_ipsum"),
        ("The function body is { return x; } in this example.", "curly_brace"),
        ("This sentence contains the word grapefruit somewhere inside.", "bad_words"),
    ],
)
def test_page_rules_remove_the_whole_page(extra, rule):
    kept, report = clean(page(*GOOD, extra), bad_words=["grapefruit", "two words"])
    assert kept == [] and report.pages_removed == {rule: 1}


def test_lorem_ipsum_and_braces_count_only_in_lines_kept_so_far():
    # A short line and a javascript line are dropped before those page rules look at them.
    kept, report = clean(page(*GOOD, "Lorem ipsum dolor.", "Enable javascript { now } to read on."))
    assert kept == [GOOD] and report.lines_removed == {"too_few_words": 1, "javascript": 1}


def test_bad_words_match_whole_words_and_phrases_only():
    words = ["ass", "two words"]
    for line, dropped in (
        ("The class passed the assessment with ease.", False),
        ("There are Two Words hidden in this line.", True),
    ):
        kept, _ = clean(page(*GOOD, line), bad_words=words)
        assert (kept == []) == dropped


def test_without_a_bad_words_list_the_rule_says_it_was_skipped():
    assert "bad_words" in C4Cleaner().report.table()


def test_pages_with_fewer_than_three_sentences():
    kept, report = clean(page(GOOD[0], GOOD[1], url="a"), page(" ".join(GOOD), url="b"))
    assert kept == [[" ".join(GOOD)]]  # three sentences on one line are enough
    assert report.pages_removed == {"too_few_sentences": 1}


def test_language_filter():
    other = [
        "Der Fluss fließt jeden Frühling durch die Altstadt.",
        "Besucher gehen oft bei Sonnenuntergang am Ufer spazieren.",
        "Haben Sie jemals die Laternen auf dem Wasser gesehen?",
    ]
    kept, report = clean(
        page(*GOOD, url="a"), page(*other, url="b"), language_filter=lambda text: "river" in text
    )
    assert kept == [GOOD] and report.pages_removed == {"language": 1}


def test_the_newest_page_of_a_url_is_kept():
    old, new = ["An older version of the page says this first."] + GOOD[1:], GOOD
    kept, report = clean(
        page(*old, url="http://www.x.org/a/", timestamp="2019-01-01"),
        page(*new, url="https://x.org/a?utm_medium=m", timestamp="2019-02-01"),
    )
    assert kept == [new] and report.pages_removed == {"duplicate_url": 1}


def test_a_repeated_line_stays_in_the_page_whose_url_hashes_smallest():
    fresh = [
        [
            "Page one has a sentence of its own here.",
            "And a second one that is new.",
            "And a third one to make three.",
        ],
        [
            "Page two says something different now.",
            "It also says a second new thing.",
            "And it finishes with a third.",
        ],
    ]
    urls = ["https://one.org", "https://two.org"]
    shared = "The SAME line, in any case, appears on both pages."
    pages = [
        page(*fresh[0], shared, shared, url=urls[0]),
        page(*fresh[1], "  " + shared.lower(), url=urls[1]),
    ]
    kept, report = clean(*pages)
    # By hand: the owner is the URL with the smaller MD5; it keeps the line once.
    owner = min(range(2), key=lambda i: hashlib.md5(urls[i].encode()).hexdigest())
    assert kept[owner] == fresh[owner] + [[shared, shared.lower()][owner]]
    assert kept[1 - owner] == fresh[1 - owner]
    assert report.lines_removed == {"duplicate_line": 2}


def test_a_page_needs_a_url():
    with pytest.raises(ValueError, match="give every page a url"):
        clean(page(*GOOD, url=""))


def test_punkt_without_its_data_says_how_to_get_it(monkeypatch, tmp_path):
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    with pytest.raises(SystemExit, match="nltk.downloader punkt_tab"):
        c4_clean.punkt_sentences()


# ------------------------------------------------------------------ paper wording
def clean_paper(*pages, **kwargs):
    cleaner = PaperWordingCleaner(**kwargs)
    return [cleaner.clean_page(p) for p in pages], cleaner


def test_paper_rules_keep_curly_quotes_and_ellipses_and_cut_any_case_citation():
    lines = [
        "She said that the lanterns were beautiful tonight.”",
        "The river went on and on and then it stopped...",
        "The bridge was built by local masons [Citation Needed].",
    ]
    (out,), _ = clean_paper(page(*lines, *GOOD))
    assert out.text.splitlines() == lines[:2] + ["The bridge was built by local masons ."] + GOOD


def test_paper_page_rules_look_at_the_raw_page():
    (out,), cleaner = clean_paper(page(*GOOD, "lorem ipsum"))
    assert out is None and cleaner.report.pages_removed == {"lorem_ipsum": 1}


def test_three_sentence_spans_are_deduplicated_keeping_the_first():
    fresh = [
        "A second page starts with its very own sentence.",
        "It then goes on to say something else entirely.",
        "Finally it ends in a completely original way.",
    ]
    (first, second, third), cleaner = clean_paper(page(*GOOD), page(*fresh, *GOOD), page(*GOOD))
    assert first.text.splitlines() == GOOD
    assert second.text.splitlines() == fresh  # the repeated span is gone, the rest stays
    # A page that is nothing but a seen span loses all its sentences, then the page.
    assert third is None and cleaner.report.pages_removed == {"duplicate_spans": 1}
    assert cleaner.report.spans_removed == 2
    # Two sentences in common are not a three-sentence span.
    partial = cleaner.clean_page(page(GOOD[0], GOOD[1], "But this third one is new here."))
    assert partial is not None and cleaner.report.spans_removed == 2


# ------------------------------------------------------------------- the command
def folder_whose_page_hashes(tmp_path, below: bool):
    """A folder for page.txt whose URL (its path) hashes below or above "a" under C4's md5, so
    the line both pages share goes to the side the test names, whatever pytest's path is."""
    for i in range(1000):
        folder = tmp_path / f"pages{i}"
        hashed = hashlib.md5(str(folder / "page.txt").encode()).hexdigest()
        if (hashed < hashlib.md5(b"a").hexdigest()) == below:
            folder.mkdir()
            return folder
    raise AssertionError("no folder name hashes that way")


@pytest.fixture(params=["crawl_keeps_line", "page_keeps_line"])
def pages_dir(request, tmp_path):
    return folder_whose_page_hashes(tmp_path, below=request.param == "page_keeps_line")


def test_command_line_reads_jsonl_and_txt_and_writes_c4_layout(
    tmp_path, pages_dir, capsys, tfds_c4
):
    other = [
        "A text file holds a page of its own here.",
        "Its second line is new as well!",
        "Does its third line end the page?",
    ]
    # Four sentences, so the page keeps C4's three when its line shared with page.txt goes to
    # page.txt (the URL that hashes lower keeps it; a three-line page would be dropped).
    crawled = GOOD + ["Boats are lit by candles when the evening falls."]
    with gzip.open(tmp_path / "crawl.jsonl.gz", "wt") as f:
        f.write(json.dumps({"text": "\n".join(crawled), "url": "a", "timestamp": "t"}) + "\n")
        f.write(json.dumps({"text": "Some lorem ipsum text is found here."}) + "\n")
    (pages_dir / "page.txt").write_text("\n".join(other + GOOD[:1]) + "\nno punctuation here")
    (tmp_path / "words.txt").write_text("grapefruit\n")
    out = tmp_path / "clean" / "c4-train.00000-of-00001.json.gz"
    args = [
        "--input",
        str(tmp_path / "*.jsonl.gz"),
        "--input",
        str(pages_dir / "page.txt"),
        "--bad_words_file",
        str(tmp_path / "words.txt"),
    ]
    report = c4_clean.main(args + ["--output", str(out)])
    with gzip.open(out, "rt") as f:
        records = [json.loads(l) for l in f]
    txt = str(pages_dir / "page.txt")
    owner = min(["a", txt], key=lambda u: hashlib.md5(u.encode()).hexdigest())
    assert records == [
        {"text": "\n".join(crawled if owner == "a" else crawled[1:]), "url": "a", "timestamp": "t"},
        {
            "text": "\n".join(other + (GOOD[:1] if owner == txt else [])),
            "url": txt,
            "timestamp": "",
        },
    ]
    # The same pages through TFDS's pipeline (whose WET reader needs a date on every page).
    read = [
        page(*crawled, url="a", timestamp="t"),
        page("Some lorem ipsum text is found here.", url="b", timestamp="t"),
        page(*other, GOOD[0], "no punctuation here", url=txt, timestamp="t"),
    ]
    assert [(r["url"], r["text"]) for r in records] == tfds_c4(read, bad_words=["grapefruit"])
    assert report.pages_removed == {"lorem_ipsum": 1}
    assert report.lines_removed == {"terminal_punct": 1, "duplicate_line": 1}
    assert "pages removed by lorem_ipsum" in capsys.readouterr().out
    # The paper's rules stream: the repeated single line stays (spans are three sentences).
    report = c4_clean.main(args + ["--output", str(out), "--rules", "paper"])
    with gzip.open(out, "rt") as f:
        assert [json.loads(l)["text"] for l in f] == [
            "\n".join(crawled),
            "\n".join(other + GOOD[:1]),
        ]
