"""C4's cleaning (T5 paper, section 2.2) for your own web-extracted text.

    python -m t5x_like.data.c4_clean --input 'crawl/*.jsonl.gz' \\
        --output clean/c4-train.00000-of-00001.json.gz \\
        --bad_words_file ldnoobw_en.txt [--language en] [--rules tfds|paper]

Input: JSONL (optionally gzipped) with a `text` field per page (`url`, `timestamp` are kept),
or plain `.txt` files holding one page each. Output: JSONL in C4's layout
(`{"text", "url", "timestamp"}`), which `t5x_like/data/text_files.py` reads directly. Prints how
many lines and pages each rule removed.

Two rule sets, because the paper's prose and the code that built C4 (TensorFlow Datasets'
`c4.py` / `c4_utils.py`) differ in places:

`--rules tfds` (default): what built C4, in its order.
  (read) the text as TFDS's WET reader leaves it: lines split at \n, \r\n or \r and
                           stripped; empty lines and lines starting with "WARC", "CONTENT-"
                           or "Content-" (WET metadata) dropped
  page  empty_page         nothing left
  page  too_long_page      text over 190,000 characters
  page  duplicate_url      pages of one URL (scheme, www., utm_/ref/feed queries, trailing /
                           ignored) but the newest by timestamp
  line  long_word          lines with a word over 1,000 characters
  line  citation markers   "[1]", "[citation needed]", "[edit]" (lower case) are cut out
  line  terminal_punct     lines not ending in . ! ? " or ending in "..."
  line  too_few_words      lines with fewer than 5 words
  page  lorem_ipsum        "lorem ipsum" (any case) in a line the rules above keep
  line  javascript         lines containing "javascript"
  page  curly_brace        "{" in a line the rules above keep
  line  policy             lines with "terms of use", "privacy policy", "cookie policy",
                           "uses cookies", "use of cookies", "use cookies"
  page  too_few_sentences  pages left with fewer than 3 sentences
  line  duplicate_line     a line (case and outer spaces ignored) stays only in the page whose
                           URL has the smallest MD5, once; pages left empty or with fewer than
                           3 sentences go (duplicate_lines)
  page  language           pages langdetect does not call English with p >= 0.99 (optional)
  page  bad_words          a word or phrase of the LDNOOBW list, flanked by non-word characters
                           (give the file; without it the rule is skipped and says so)
  The line de-duplication needs every page first, so this rule set holds the cleaned text of
  the whole input in memory.

`--rules paper`: section 2.2's wording, streaming. Page rules (lorem ipsum, "{", bad words) on
the raw page; citation markers in any case; lines must end in . ! ? " or ”; no long-word or
ellipsis rule; every three-sentence span seen before (in an earlier page or earlier in the same
page) is removed, keeping its first occurrence.

Sentences are counted by a regex (split at . ! ? plus an optional closing quote, then
whitespace), which needs no downloaded model. TFDS counts them with NLTK's English punkt model:
`--sentence_splitter punkt` uses it when its data is installed
(`python -m nltk.downloader punkt_tab`); the two differ only on pages near 3 sentences whose
sentences end in abbreviations.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import hashlib
import io
import json
import os
import re
import sys
from typing import Callable, Iterable, Iterator, Sequence

from t5x_like import logs

MIN_WORDS_PER_LINE = 5
MIN_SENTENCES_PER_PAGE = 3
MAX_WORD_LENGTH = 1000
MAX_PAGE_CHARACTERS = 190_000
DEDUP_SPAN_SENTENCES = 3
POLICY_SUBSTRINGS = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)
TFDS_END_MARKS = (".", "?", "!", '"')
PAPER_END_MARKS = (".", "!", "?", '"', "”")
TFDS_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
PAPER_CITATION = re.compile(TFDS_CITATION.pattern, re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”]?\s+")
RULES = ("tfds", "paper")
WET_METADATA_PREFIXES = ("WARC", "CONTENT-", "Content-")

LanguageFilter = Callable[[str], bool]
SentenceSplitter = Callable[[str], Sequence[str]]


@dataclasses.dataclass
class Page:
    text: str
    url: str = ""
    timestamp: str = ""


@dataclasses.dataclass
class CleaningReport:
    """What each rule removed: lines (line rules) and pages (page rules)."""

    pages_in: int = 0
    pages_out: int = 0
    pages_removed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    lines_removed: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    spans_removed: int = 0
    skipped_rules: list[str] = dataclasses.field(default_factory=list)

    def table(self) -> str:
        lines = [f"pages in: {self.pages_in:,}   pages out: {self.pages_out:,}"]
        for rule, n in sorted(self.lines_removed.items()):
            lines.append(f"  lines removed by {rule:<18} {n:,}")
        for rule, n in sorted(self.pages_removed.items()):
            lines.append(f"  pages removed by {rule:<18} {n:,}")
        if self.spans_removed:
            lines.append(f"  duplicate three-sentence spans removed: {self.spans_removed:,}")
        lines += [f"  skipped: {why}" for why in self.skipped_rules]
        return "\n".join(lines)


def split_sentences(text: str) -> list[str]:
    """Sentences by a regex: no downloaded model needed (see the module docstring)."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


def punkt_sentences() -> SentenceSplitter:
    """NLTK's English punkt model, which TFDS's C4 counts sentences with."""
    try:
        from nltk.tokenize import PunktTokenizer

        return PunktTokenizer("english").tokenize
    except LookupError as e:
        raise SystemExit(
            "--sentence_splitter punkt needs NLTK's punkt data: run "
            "`python -m nltk.downloader punkt_tab` (or use the default regex "
            "splitter)."
        ) from e


def load_bad_words(path: str) -> frozenset[str]:
    """One word or phrase per line (the LDNOOBW file format), as TFDS reads it."""
    with open(path, encoding="utf-8") as f:
        return frozenset(w.strip() for w in f if w.strip())


def _bad_words_pattern(words: Iterable[str]) -> re.Pattern | None:
    """TFDS's pattern for spaced languages: the word flanked by non-word characters."""
    words = sorted(words, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?:\W|^)(?:" + "|".join(re.escape(w) for w in words) + r")(?:\W|$)")


def normalize_url(url: str) -> str:
    """The key C4 de-duplicates pages by (TFDS `c4_utils.normalize_url`)."""
    url = re.sub(r"https?:\/\/(www\.)?", "", url)
    url = re.sub(r"\?(utm_|ref|feed).*", "", url)
    return url.rstrip("/")


def wet_text(text: str) -> str:
    """A page's text as TFDS's `split_wet_file` reads it from a WET file (module docstring)."""
    lines = (line.strip() for line in re.split(r"\r\n|\r|\n", text))
    return "\n".join(l for l in lines if l and not l.startswith(WET_METADATA_PREFIXES))


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


def langdetect_english(threshold: float = 0.99) -> LanguageFilter:
    """langdetect's verdict, as C4 used it: English with probability >= threshold."""
    try:
        import langdetect
    except ImportError as e:
        raise SystemExit(
            "The language filter needs langdetect: pip install langdetect (or drop --language)."
        ) from e
    langdetect.DetectorFactory.seed = 0

    def is_english(text: str) -> bool:
        try:
            best = langdetect.detect_langs(text)[:1]  # TFDS reads the top prediction only
        except langdetect.LangDetectException:
            return False
        return bool(best) and best[0].lang == "en" and best[0].prob >= threshold

    return is_english


class _Cleaner:
    """What both rule sets share: the report, bad words, language and sentence counting."""

    def __init__(
        self,
        bad_words: Iterable[str] | None = None,
        language_filter: LanguageFilter | None = None,
        sentence_splitter: SentenceSplitter = split_sentences,
    ) -> None:
        self.report = CleaningReport()
        self._bad_words = _bad_words_pattern(bad_words or ())
        if self._bad_words is None:
            self.report.skipped_rules.append("bad_words (no list given: --bad_words_file)")
        self._language_filter = language_filter
        self._sentences = sentence_splitter

    def _has_bad_word(self, text: str) -> bool:
        return self._bad_words is not None and self._bad_words.search(text.lower()) is not None

    def _count_sentences(self, lines: Iterable[str]) -> int:
        return sum(len(self._sentences(line)) for line in lines)

    def _remove(self, rule: str) -> None:
        self.report.pages_removed[rule] += 1

    def _keep(self, page: Page, lines: Sequence[str]) -> Page:
        self.report.pages_out += 1
        return Page("\n".join(lines), page.url, page.timestamp)


class C4Cleaner(_Cleaner):
    """The rules of the code that built C4 (TFDS `c4.py`), in its order (module docstring).

    `clean` reads every page before it yields the first: the newest page of each URL and the
    one page that keeps each repeated line are known only then.
    """

    def clean_lines(self, text: str, removed: collections.Counter | None = None) -> list[str] | str:
        """TFDS `clean_page`'s line loop: the kept lines, or the page rule that drops the page.

        Removed lines are counted in `removed` (default: the report)."""
        removed = self.report.lines_removed if removed is None else removed
        kept = []
        for line in text.splitlines():
            line = line.strip()
            if any(len(word) > MAX_WORD_LENGTH for word in line.split()):
                rule = "long_word"
            else:
                line = TFDS_CITATION.sub("", line)
                lowered = line.lower()
                if not line.endswith(TFDS_END_MARKS) or line.endswith("..."):
                    rule = "terminal_punct"
                elif len(line.split()) < MIN_WORDS_PER_LINE:
                    rule = "too_few_words"
                elif "lorem ipsum" in lowered:
                    return "lorem_ipsum"
                elif "javascript" in lowered:
                    rule = "javascript"
                elif "{" in line:
                    return "curly_brace"
                elif any(p in lowered for p in POLICY_SUBSTRINGS):
                    rule = "policy"
                else:
                    kept.append(line)
                    continue
            removed[rule] += 1
        if self._count_sentences(kept) < MIN_SENTENCES_PER_PAGE:
            return "too_few_sentences"
        # TFDS strips the joined page: a cut citation can leave the first line's space.
        return "\n".join(kept).strip().split("\n")

    def _newest_page_per_url(self, pages: Iterable[Page]) -> list[tuple[Page, list[str]]]:
        newest: dict[str, tuple[Page, list[str] | str, collections.Counter]] = {}
        for page in pages:
            self.report.pages_in += 1
            if not page.url:
                raise ValueError(
                    "C4's rules de-duplicate pages by URL: give every page a url "
                    f"(page {self.report.pages_in} has none)."
                )
            page = Page(wet_text(page.text), page.url, str(page.timestamp or ""))
            if not page.text:
                self._remove("empty_page")
                continue
            if len(page.text) > MAX_PAGE_CHARACTERS:
                self._remove("too_long_page")
                continue
            key = normalize_url(page.url)
            if key in newest:
                self._remove("duplicate_url")
                if page.timestamp <= newest[key][0].timestamp:
                    continue
            removed = collections.Counter()
            newest[key] = (page, self.clean_lines(page.text, removed), removed)
        kept = []
        for page, lines, removed in newest.values():
            self.report.lines_removed.update(removed)
            if isinstance(lines, str):
                self._remove(lines)
            else:
                kept.append((page, lines))
        return kept

    def clean(self, pages: Iterable[Page]) -> Iterator[Page]:
        cleaned = self._newest_page_per_url(pages)
        # Each line (lower-cased, stripped) belongs to the page whose URL hashes smallest.
        owner: dict[str, str] = {}
        for page, lines in cleaned:
            url_hash = _md5(page.url)
            for line in lines:
                key = _md5(line.strip().lower())
                owner[key] = min(owner.get(key, url_hash), url_hash)
        for page, lines in cleaned:
            url_hash, seen, unique = _md5(page.url), set(), []
            for line in lines:
                key = _md5(line.strip().lower())
                if owner[key] == url_hash and key not in seen:
                    seen.add(key)
                    unique.append(line)
                else:
                    self.report.lines_removed["duplicate_line"] += 1
            text = "\n".join(unique)
            if not text or len(self._sentences(text)) < MIN_SENTENCES_PER_PAGE:
                self._remove("duplicate_lines")
            elif self._language_filter and not self._language_filter(text):
                self._remove("language")
            elif self._has_bad_word(text):
                self._remove("bad_words")
            else:
                yield self._keep(page, unique)


class PaperWordingCleaner(_Cleaner):
    """Section 2.2's wording (module docstring), streaming: de-duplication state spans every
    page given to `clean_page`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._seen_spans: set[bytes] = set()

    def _page_rule(self, text: str) -> str | None:
        lowered = text.lower()
        if "lorem ipsum" in lowered:
            return "lorem_ipsum"
        if "{" in text:
            return "curly_brace"
        if self._has_bad_word(text):
            return "bad_words"
        return None

    def _line_rule(self, line: str) -> str | None:
        if not line.endswith(PAPER_END_MARKS):
            return "terminal_punct"
        if len(line.split()) < MIN_WORDS_PER_LINE:
            return "too_few_words"
        lowered = line.lower()
        if "javascript" in lowered:
            return "javascript"
        if any(p in lowered for p in POLICY_SUBSTRINGS):
            return "policy"
        return None

    def clean_lines(self, text: str) -> list[str]:
        kept = []
        for raw in text.splitlines():
            line = PAPER_CITATION.sub("", raw).strip()
            if not line:
                continue
            rule = self._line_rule(line)
            if rule:
                self.report.lines_removed[rule] += 1
            else:
                kept.append(line)
        return kept

    def _dedupe(self, lines: list[str]) -> list[str]:
        """Remove every three-sentence window seen before; keep the first occurrence."""
        sentences = [(i, s) for i, line in enumerate(lines) for s in self._sentences(line)]
        drop = set()
        for start in range(len(sentences) - DEDUP_SPAN_SENTENCES + 1):
            window = sentences[start : start + DEDUP_SPAN_SENTENCES]
            key = hashlib.md5("\n".join(s for _, s in window).encode()).digest()
            if key in self._seen_spans:
                drop.update(range(start, start + DEDUP_SPAN_SENTENCES))
                self.report.spans_removed += 1
            else:
                self._seen_spans.add(key)
        by_line: dict[int, list[str]] = collections.defaultdict(list)
        for k, (i, s) in enumerate(sentences):
            if k not in drop:
                by_line[i].append(s)
        return [" ".join(by_line[i]) for i in sorted(by_line)]

    def clean_page(self, page: Page) -> Page | None:
        self.report.pages_in += 1
        rule = self._page_rule(page.text)
        lines = [] if rule else self.clean_lines(page.text)
        if not rule and self._count_sentences(lines) < MIN_SENTENCES_PER_PAGE:
            rule = "too_few_sentences"
        if not rule and self._language_filter and not self._language_filter("\n".join(lines)):
            rule = "language"
        if not rule:
            lines = self._dedupe(lines)
            if self._count_sentences(lines) < MIN_SENTENCES_PER_PAGE:
                rule = "duplicate_spans"
        if rule:
            self._remove(rule)
            return None
        return self._keep(page, lines)

    def clean(self, pages: Iterable[Page]) -> Iterator[Page]:
        for page in pages:
            cleaned = self.clean_page(page)
            if cleaned is not None:
                yield cleaned


CLEANERS = {"tfds": C4Cleaner, "paper": PaperWordingCleaner}


# ----------------------------------------------------------------------- files
def _open_text(path: str):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _bytes_read(f: io.TextIOWrapper) -> int:
    """How far into the file on disk reading has got (compressed bytes for .gz), to within
    the read-ahead buffer: progress against the files' sizes."""
    raw = f.buffer.fileobj if isinstance(f.buffer, gzip.GzipFile) else f.buffer
    return raw.tell()


def read_pages(
    paths: Sequence[str], text_key: str = "text", on_read: Callable[[int], object] | None = None
) -> Iterator[Page]:
    """JSONL(.gz) with `text_key` per line, or .txt files of one page each (its path is its
    url). `on_read(n)` is told each time n more bytes of the files on disk were read."""
    for path in paths:
        if path.endswith((".txt", ".txt.gz")):
            with _open_text(path) as f:
                yield Page(f.read(), url=os.path.abspath(path))
            if on_read:
                on_read(os.path.getsize(path))
            continue
        done = 0
        with _open_text(path) as f:
            for n, line in enumerate(f, start=1):
                if on_read:
                    now = _bytes_read(f)
                    on_read(now - done)
                    done = now
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(
                        f"{path}:{n} is not JSON ({e}); give JSONL with a "
                        f"{text_key!r} field or .txt files."
                    ) from e
                if text_key not in record:
                    raise SystemExit(
                        f"{path}:{n} has no {text_key!r} field (fields: "
                        f"{sorted(record)}); set --text_key."
                    )
                # C4's rules key pages by URL: one without is named by its place.
                yield Page(
                    record[text_key],
                    record.get("url") or f"{path}:{n}",
                    record.get("timestamp", ""),
                )
        if on_read:
            on_read(os.path.getsize(path) - done)


def write_pages(pages: Iterable[Page], path: str) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    opener = (
        gzip.open(path, "wt", encoding="utf-8")
        if path.endswith(".gz")
        else open(path, "w", encoding="utf-8")
    )
    n = 0
    with opener as f:
        for page in pages:
            f.write(
                json.dumps(
                    {"text": page.text, "url": page.url, "timestamp": page.timestamp},
                    ensure_ascii=False,
                )
                + "\n"
            )
            n += 1
    return n


def main(argv: Sequence[str] | None = None) -> CleaningReport:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--input",
        action="append",
        required=True,
        help="file or glob (repeatable): JSONL(.gz) pages or .txt files",
    )
    parser.add_argument("--output", required=True, help="JSONL(.gz) in C4's layout")
    parser.add_argument("--text_key", default="text")
    parser.add_argument(
        "--bad_words_file",
        default=None,
        help="the LDNOOBW list for your language, one entry per line",
    )
    parser.add_argument(
        "--language",
        default=None,
        choices=["en"],
        help="keep pages langdetect calls English with p >= 0.99",
    )
    parser.add_argument(
        "--rules",
        default="tfds",
        choices=RULES,
        help="tfds: what built C4 (default); paper: section 2.2's wording",
    )
    parser.add_argument(
        "--sentence_splitter",
        default="regex",
        choices=["regex", "punkt"],
        help="punkt: NLTK's English model, as TFDS counts (needs its data)",
    )
    args = parser.parse_args(argv)
    paths = sorted(p for pattern in args.input for p in glob.glob(pattern))
    if not paths:
        raise SystemExit(f"No input files match {args.input}.")
    bad_words = load_bad_words(args.bad_words_file) if args.bad_words_file else None
    splitter = punkt_sentences() if args.sentence_splitter == "punkt" else split_sentences
    cleaner = CLEANERS[args.rules](
        bad_words, langdetect_english() if args.language else None, splitter
    )
    bar = logs.progress(
        desc="c4_clean read",
        total=sum(os.path.getsize(p) for p in paths),
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
    )
    with bar:
        write_pages(
            cleaner.clean(read_pages(paths, args.text_key, on_read=bar.update)), args.output
        )
    logs.log(cleaner.report.table())
    return cleaner.report


def console_main() -> int:
    """The `t5x-like-c4-clean` console command: `main` on the command line, exit code 0 (`main`
    returns what it did, for callers in Python)."""
    main(sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(console_main())
