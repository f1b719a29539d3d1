#!/usr/bin/env python3
"""Writes tests/data/tok_strings.jsonl: the tokenizer test strings, one JSON object a line
({"id": N, "text": "..."}, ASCII-escaped so every byte survives). Deterministic: a fixed list of
hand-written cases plus seeded random mixes of the same building blocks. Run from the repo root:
    python3 tests/data/make_tok_strings.py
"""
import json
import random
import sys

HAND = [
    # plain English, contractions, casing
    "Hello world",
    "Hello, world!",
    " Hello world",
    "  Hello world",
    "hello",
    "HELLO WORLD",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see it's what they've said we'd do.",
    "I'M SURE YOU'LL SEE IT'S WHAT THEY'VE SAID WE'D DO.",
    "They'RE here and it'S fine, we'Ve 'll 'd 'm 't 's",
    "don't can't won't shouldn't y'all o'clock rock'n'roll",
    "'s",
    "'",
    "''",
    "'''s",
    "What is the capital of France? Answer in one sentence.",
    "Once upon a time, in a land far, far away, there lived a small dragon.",
    "e.g. i.e. etc. Mr. Smith vs. Mrs. Jones -- a U.S.A. story...",
    # digits and numbers
    "0",
    "7",
    "42",
    "123",
    "1234",
    "12345678901234567890",
    "3.14159265358979323846",
    "-273.15",
    "1,000,000",
    "1e-10 and 6.022e23",
    "0x1F 0b1010 0o777",
    "version 2.10.3-rc1",
    "call 555-0199 or +1 (800) 555 0199",
    "2024-07-26T12:34:56Z",
    "abc123def456",
    "x1y22z333w4444",
    " 1 2 3 4 5",
    "  123  456  ",
    "Room 101, floor 7",
    "$1,234.56 and €99,99 and £5 and ¥1000",
    "50% off! 3/4 cup, 1½ pints, ² ³ ¼",
    "٠١٢٣٤٥٦٧٨٩ and ０１２３ and ①②③",
    # whitespace
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    "\n\n\n\n",
    " \n",
    "\n ",
    "a\nb",
    "a\n\nb",
    "a \n b",
    "a\r\nb\r\nc",
    "a\rb",
    "line one\nline two\n",
    "tab\tseparated\tvalues\there",
    "\t\tindented with tabs",
    "trailing spaces   ",
    "   leading spaces",
    "multiple     spaces     between",
    "a  b   c    d     e",
    " \t \n \r\n  x",
    "\u000b vertical tab \u000c form feed",
    "mixed \t\n whitespace \n\t runs",
    "end with newline\n",
    "end with spaces and newline  \n",
    # punctuation
    "!!!",
    "?!?!",
    "...",
    "—",
    "--- *** ___ ===",
    "(a) [b] {c} <d>",
    "\"quoted\" and 'single' and `back`",
    "a,b;c:d.e!f?g",
    "#hashtag @mention $var %percent ^caret &and *star",
    "~/path/to/file.txt",
    "C:\\Windows\\System32",
    "https://example.com/path?query=1&x=y#frag",
    "user@example.org",
    "<|im_start|>user\nhi<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>",
    "<|fake_token|>",
    "<repo_name>sift<file_sep>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>",
    # code
    "def f(x):\n    return x * 2\n",
    "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "    if x == 1:\n        pass\n    elif x != 2:\n        raise ValueError('bad')\n",
    "const x = () => { return [1, 2, 3].map(v => v ** 2); };",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "<html><body><p class=\"x\">Hi &amp; bye</p></body></html>",
    "{\"key\": [1, 2.5, true, null], \"nested\": {\"a\": \"b\"}}",
    "#include <stdio.h>\n#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "fn main() { let v: Vec<u32> = vec![1, 2]; println!(\"{:?}\", v); }",
    "$ ls -la | grep '^d' && echo \"done\" > /dev/null 2>&1",
    "x+=1;y-=2;z*=3;w/=4;q%=5;r<<=1;s>>=2;",
    "\tif (a&&b||!c) {\n\t\treturn;\n\t}",
    "# Title\n\n- item one\n- item two\n\n```python\nprint('hi')\n```\n",
    # accented Latin and other European
    "café",
    "naïve résumé façade",
    "Ångström über straße Øresund",
    "El niño comió piña en la montaña.",
    "Crème brûlée à la française",
    "Zażółć gęślą jaźń",
    "Příliš žluťoučký kůň úpěl ďábelské ódy",
    "İstanbul ılık şğü",
    "ΑΒΓ αβγ Ελληνικά",
    "Привет, мир! Как дела?",
    "Съешь же ещё этих мягких французских булок",
    "Україна, Київ",
    # CJK
    "你好，世界",
    "我爱自然语言处理。",
    "日本語のテキストです。",
    "ひらがな カタカナ 漢字",
    "한국어 텍스트입니다",
    "中文English混合text",
    "東京2024年7月26日",
    "（全角括弧）「引用」『二重』",
    # RTL and other scripts
    "مرحبا بالعالم",
    "العربية ١٢٣",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีครับ",
    "ሰላም ለዓለም",
    "Γειά σου Κόσμε",
    "ᚠᚢᚦᚨᚱᚲ",
    # emoji
    "😀",
    "😀😃😄",
    "I ❤️ NY",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "👩🏾‍💻 coding",
    "🇫🇷🇩🇪🇯🇵",
    "emoji at end 🎉",
    "🎉 emoji at start",
    "keycap 1️⃣ #️⃣",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕄𝕒𝕥𝕙",
    "𠜎𠜱𠝹 rare CJK extension B",
    # combining marks and normalisation
    "e\u0301",
    "cafe\u0301",
    "a\u0300\u0301\u0302\u0303",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320",
    "\u0915\u094d\u0937",
    "n\u0303",
    # odd Unicode
    "non\u00a0breaking\u00a0space",
    "\u00a0",
    "line\u2028separator",
    "para\u2029separator",
    "\u2028",
    "zero\u200bwidth\u200cjoiner\u200dstuff",
    "\ufeffBOM at start",
    "soft\u00adhyphen",
    "en\u2002em\u2003thin\u2009hair\u200a spaces",
    "ideographic\u3000space",
    "narrow\u202fnbsp",
    "next\u0085line",
    "mongolian\u180evowel",
    "ogham\u1680space",
    "math\u205fspace",
    "\u2060word\u2060joiner",
    "control \u0001\u0002\u0003 chars",
    "escape \u001b[31mred\u001b[0m",
    "nul\u0000byte",
    "del\u007fchar",
    # bytes the SmolLM2 vocabulary has no token for (0x04 0x06 0x13 0x14 0x16 0x1D; 0xF1/0xF2 lead
    # bytes of planes 4..11)
    "ctrl \u0004\u0006\u0013\u0014\u0016\u001d chars",
    "!!\u0004!!",
    "..\u001d..",
    "ab\u0006cd",
    "  \u0013  ",
    "plane4 \U00040001 plane10 \U000a0000\U000a0001",
    "private use \ue000\uf8ff",
    "replacement \ufffd char",
    "\U0010fffd last plane",
    "fullwidth Ｈｅｌｌｏ",
    "superscript x² and subscript H₂O",
    "roman Ⅻ and circled Ⓐ",
    "arrows → ← ↑ ↓ ⇒",
    "math ∀x∈ℝ: x² ≥ 0 ∑∫∂",
    "box ┌─┐│└┘",
    "quotes “smart” ‘single’ «guillemets» „low“",
    "dash – — ‒ ―",
    "ellipsis … bullet • middle·dot",
    "’s curly contraction it’s",
]

WORDS = [
    "the", "The", "THE", "token", "tokenizer", "merge", "ranks", "über", "naïve", "東京", "世界",
    "مرحبا", "Привет", "😀", "👨‍👩‍👧", "42", "3.14", "1000000", "x", "y_z", "CamelCase",
    "snake_case", "it's", "we'll", "THEY'RE", "don't", "'s", "e\u0301", "\u00a0", "\u2028",
    "<|im_start|>", "<|im_end|>", "<tag>", "http://a.b/c", "#", "...", "!!", "(", ")", "{", "}",
    "\"", "'", "`", "\\", "/", "-", "_", "=", "+", "*", "&", "|", "^", "%", "$", "@", "~",
]
SEPS = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n", "\n ", "", ", ", ". ", "\u3000",
        "\u00a0", " \t "]


def random_mix(rng):
    n = rng.randint(1, 14)
    out = []
    for _ in range(n):
        out.append(rng.choice(WORDS))
        out.append(rng.choice(SEPS))
    if rng.random() < 0.3:
        out.insert(0, rng.choice(SEPS))
    return "".join(out)


def random_digits(rng):
    n = rng.randint(1, 40)
    s = "".join(rng.choice("0123456789") for _ in range(n))
    pre = rng.choice(["", " ", "  ", "x", "$", "-", "\n", "v"])
    post = rng.choice(["", " ", "%", ".5", "px", "\n", "th"])
    return pre + s + post


def random_whitespace(rng):
    n = rng.randint(1, 20)
    s = "".join(rng.choice([" ", " ", " ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000"])
                for _ in range(n))
    if rng.random() < 0.5:
        s = s + rng.choice(["a", "1", "!", "é", "字"])
    if rng.random() < 0.5:
        s = rng.choice(["a", "1", "!", "é", "字"]) + s
    return s


def random_codepoints(rng):
    # Random characters from a few ranges (valid scalar values only: no surrogates).
    ranges = [(0x20, 0x7e), (0xa0, 0x17f), (0x370, 0x3ff), (0x400, 0x4ff), (0x590, 0x6ff),
              (0x900, 0x97f), (0x3040, 0x30ff), (0x4e00, 0x4fff), (0xac00, 0xad00),
              (0x1f300, 0x1f6ff), (0x2000, 0x206f), (0x300, 0x36f)]
    n = rng.randint(1, 25)
    chars = []
    for _ in range(n):
        lo, hi = rng.choice(ranges)
        chars.append(chr(rng.randint(lo, hi)))
    return "".join(chars)


def main():
    rng = random.Random(20240726)
    strings = list(HAND)
    gens = [random_mix, random_digits, random_whitespace, random_codepoints]
    while len(strings) < 420:
        strings.append(gens[len(strings) % len(gens)](rng))
    # One long line of prose and code (a few thousand characters) to exercise long pre-tokens.
    strings.append(" ".join(HAND[:60]) * 3)
    strings.append(" " * 300 + "x")
    strings.append("a" * 500)
    strings.append("\n" * 200)
    strings.append("1" * 250)
    for s in strings:  # every string must be valid UTF-8 (no lone surrogates)
        s.encode("utf-8")
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/tok_strings.jsonl"
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for i, s in enumerate(strings):
            f.write(json.dumps({"id": i, "text": s}, ensure_ascii=True) + "\n")
    print(f"wrote {len(strings)} strings to {path}")


if __name__ == "__main__":
    main()
