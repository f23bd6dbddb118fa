"""C4's cleaning heuristics (T5 paper, section 2.2) for your own web-extracted text.

    python -m t5x_like.data.c4_clean --input 'crawl/*.jsonl.gz' --output clean/c4-train.00000-of-00001.json.gz \\
        --bad_words_file ldnoobw_en.txt [--language en]

Input: JSONL (optionally gzipped) with a `text` field per page (`url`, `timestamp` are kept),
or plain `.txt` files holding one page each. Output: JSONL in C4's layout
(`{"text", "url", "timestamp"}`), which `tasks/c4_files.py` reads directly. Prints how many
lines and pages each rule removed.

Rules, in the order applied:
  page  lorem_ipsum        "lorem ipsum" anywhere (case-insensitive)
  page  curly_brace        any "{" (code, not prose)
  page  bad_words          any word of the "List of Dirty, Naughty, Obscene or Otherwise Bad
                           Words" (give the file; without it the rule is skipped and says so)
  line  citation markers   "[1]", "[citation needed]", "[edit]" are cut out of lines
  line  terminal_punct     lines not ending in . ! ? or a closing quote
  line  too_few_words      lines with fewer than 5 words
  line  javascript         lines containing "javascript"
  line  policy             lines with "terms of use", "privacy policy", "cookie policy",
                           "uses cookies", "use of cookies", "use cookies"
  page  too_few_sentences  pages left with fewer than 3 sentences
  page  language           pages the detector does not call English with p >= 0.99 (optional,
                           needs `pip install langdetect`)
  span  duplicate_spans    every three-sentence span already seen in an earlier page (or earlier
                           in the same page) is removed, keeping its first occurrence; pages
                           left with fewer than 3 sentences are dropped afterwards

Sentences are split at . ! ? (optionally followed by a quote) and whitespace, a rule that needs
no downloaded tokenizer model.
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

TERMINAL_PUNCTUATION = (".", "!", "?", '"', "”")
MIN_WORDS_PER_LINE = 5
MIN_SENTENCES_PER_PAGE = 3
DEDUP_SPAN_SENTENCES = 3
POLICY_SUBSTRINGS = ("terms of use", "privacy policy", "cookie policy", "uses cookies",
                     "use of cookies", "use cookies")
CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”]?\s+")

LanguageFilter = Callable[[str], bool]


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
        lines.append(f"  duplicate three-sentence spans removed: {self.spans_removed:,}")
        lines += [f"  skipped: {why}" for why in self.skipped_rules]
        return "\n".join(lines)


def split_sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text.strip()) if s]


def load_bad_words(path: str) -> frozenset[str]:
    """One word or phrase per line (the LDNOOBW file format)."""
    with open(path, encoding="utf-8") as f:
        return frozenset(w.strip().lower() for w in f if w.strip())


def _bad_words_pattern(words: Iterable[str]) -> re.Pattern | None:
    words = sorted(words, key=len, reverse=True)
    if not words:
        return None
    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in words) + r")(?!\w)")


def langdetect_english(threshold: float = 0.99) -> LanguageFilter:
    """langdetect's verdict, as C4 used it: English with probability >= threshold."""
    try:
        import langdetect
    except ImportError as e:
        raise SystemExit("The language filter needs langdetect: pip install langdetect "
                         "(or drop --language).") from e
    langdetect.DetectorFactory.seed = 0

    def is_english(text: str) -> bool:
        try:
            return any(l.lang == "en" and l.prob >= threshold
                       for l in langdetect.detect_langs(text))
        except langdetect.LangDetectException:
            return False

    return is_english


class C4Cleaner:
    """The section 2.2 pipeline. Deduplication state spans every page given to `clean`."""

    def __init__(self, bad_words: Iterable[str] | None = None,
                 language_filter: LanguageFilter | None = None) -> None:
        self.report = CleaningReport()
        self._bad_words = _bad_words_pattern(bad_words or ())
        if self._bad_words is None:
            self.report.skipped_rules.append("bad_words (no list given: --bad_words_file)")
        self._language_filter = language_filter
        self._seen_spans: set[bytes] = set()

    # --------------------------------------------------------------------- page rules
    def _page_rule(self, text: str) -> str | None:
        lowered = text.lower()
        if "lorem ipsum" in lowered:
            return "lorem_ipsum"
        if "{" in text:
            return "curly_brace"
        if self._bad_words is not None and self._bad_words.search(lowered):
            return "bad_words"
        return None

    def _line_rule(self, line: str) -> str | None:
        if not line.endswith(TERMINAL_PUNCTUATION):
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
            line = CITATION.sub("", raw).strip()
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
        sentences = [(i, s) for i, line in enumerate(lines) for s in split_sentences(line)]
        drop = set()
        for start in range(len(sentences) - DEDUP_SPAN_SENTENCES + 1):
            window = sentences[start:start + DEDUP_SPAN_SENTENCES]
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
        if not rule and sum(len(split_sentences(l)) for l in lines) < MIN_SENTENCES_PER_PAGE:
            rule = "too_few_sentences"
        if not rule and self._language_filter and not self._language_filter("\n".join(lines)):
            rule = "language"
        if not rule:
            lines = self._dedupe(lines)
            if sum(len(split_sentences(l)) for l in lines) < MIN_SENTENCES_PER_PAGE:
                rule = "duplicate_spans"
        if rule:
            self.report.pages_removed[rule] += 1
            return None
        self.report.pages_out += 1
        return Page("\n".join(lines), page.url, page.timestamp)

    def clean(self, pages: Iterable[Page]) -> Iterator[Page]:
        for page in pages:
            cleaned = self.clean_page(page)
            if cleaned is not None:
                yield cleaned


# ----------------------------------------------------------------------- files
def _open_text(path: str):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_pages(paths: Sequence[str], text_key: str = "text") -> Iterator[Page]:
    """JSONL(.gz) with `text_key` per line, or .txt files of one page each."""
    for path in paths:
        if path.endswith((".txt", ".txt.gz")):
            with _open_text(path) as f:
                yield Page(f.read(), url=os.path.abspath(path))
            continue
        with _open_text(path) as f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{n} is not JSON ({e}); give JSONL with a "
                                     f"{text_key!r} field or .txt files.") from e
                if text_key not in record:
                    raise SystemExit(f"{path}:{n} has no {text_key!r} field (fields: "
                                     f"{sorted(record)}); set --text_key.")
                yield Page(record[text_key], record.get("url", ""),
                           record.get("timestamp", ""))


def write_pages(pages: Iterable[Page], path: str) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    opener = gzip.open(path, "wt", encoding="utf-8") if path.endswith(".gz") else open(
        path, "w", encoding="utf-8")
    n = 0
    with opener as f:
        for page in pages:
            f.write(json.dumps({"text": page.text, "url": page.url,
                                "timestamp": page.timestamp}, ensure_ascii=False) + "\n")
            n += 1
    return n


def main(argv: Sequence[str] | None = None) -> CleaningReport:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", action="append", required=True,
                        help="file or glob (repeatable): JSONL(.gz) pages or .txt files")
    parser.add_argument("--output", required=True, help="JSONL(.gz) in C4's layout")
    parser.add_argument("--text_key", default="text")
    parser.add_argument("--bad_words_file", default=None,
                        help="the LDNOOBW list for your language, one entry per line")
    parser.add_argument("--language", default=None, choices=["en"],
                        help="keep pages langdetect calls English with p >= 0.99")
    args = parser.parse_args(argv)
    paths = sorted(p for pattern in args.input for p in glob.glob(pattern))
    if not paths:
        raise SystemExit(f"No input files match {args.input}.")
    bad_words = load_bad_words(args.bad_words_file) if args.bad_words_file else None
    cleaner = C4Cleaner(bad_words, langdetect_english() if args.language else None)
    write_pages(cleaner.clean(read_pages(paths, args.text_key)), args.output)
    print(cleaner.report.table())
    return cleaner.report


if __name__ == "__main__":
    main(sys.argv[1:])
