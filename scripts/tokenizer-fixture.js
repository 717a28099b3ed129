// tokenizer-fixture.js: the fixture of tests/models/tokenizer_test.cpp, GPT-2's tokenization of a
// few thousand pieces of varied text by the `gpt-3-encoder` package (npm), the reference that
// Dist's BPE is checked against.
//
//   npm pack gpt-3-encoder && tar xzf gpt-3-encoder-*.tgz
//   node scripts/tokenizer-fixture.js package tests/fixtures/gpt2_bpe
//
// Writes, one line per piece: text.jsonl (the piece as a JSON string), words.txt (the byte
// lengths of the words GPT-2's pattern cuts it into) and ids.txt (the token ids). The pieces are
// the first 1500 fortunes of five files of Debian's `fortunes` package and 1500 lines built here from a seeded generator:
// white space of every kind and length, contractions in both cases, digits and numbers, words in
// a dozen scripts, combining marks, emoji and symbols.
'use strict';
const fs = require('fs');
const path = require('path');

const [pkg, out] = process.argv.slice(2);
if (!pkg || !out) {
    console.error('usage: node scripts/tokenizer-fixture.js PACKAGE_DIR OUT_DIR');
    process.exit(2);
}
const { encode } = require(path.resolve(pkg, 'index.js'));
const pattern = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

// mulberry32: a small seeded generator, so that the pieces are the same on every run.
let state = 20261201;
function random() {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (list) => list[Math.floor(random() * list.length)];

const words = ['hello', 'World', 'GPT', 'naïve', 'café', 'Straße', 'ǅemal', 'Ελληνικά', 'Привет',
               'мир', '日本語', 'テスト', '中文', '한국어', 'العربية', 'עברית', 'हिन्दी', 'ไทย',
               'e\u0301t\u00e9', 'n\u0303o', 'Ａｂｃ', 'ﬁne', 'ſ', 'İstanbul', 'ΣΊΣΥΦΟΣ'];
const numbers = ['0', '7', '42', '3.14159', '1,000,000', '2026-12-01', '0x1F', '½', 'x²', 'Ⅻ',
                 '٣٤٥', '१२३', '０１２', '1e-5', '007', '99.9%'];
const marks = ['.', ',', '!', '?', '...', '—', '…', '«', '»', '“', '”', '"', '(', ')', '-', '_',
               '@', '#', '$', '&', '*', '/', '\\', '©', '™', '€', '£', '😀', '👍🏽', '🇫🇷', '\u200b',
               '\u00ad', '|', '~', '^'];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'LL", "'x", "'",
                      "''"];
const spaces = [' ', ' ', ' ', '  ', '   ', '\t', ' \t ', '\u00a0', '\u3000', '\u2003', '\n',
                ' \n', '\n\n', '\r\n', '    \n  '];

function line() {
    let s = '';
    const n = 1 + Math.floor(random() * 14);
    for (let i = 0; i < n; ++i) {
        const r = random();
        if (r < 0.4) s += pick(words);
        else if (r < 0.55) s += pick(numbers);
        else if (r < 0.7) s += pick(marks);
        else if (r < 0.8) s += pick(contractions);
        if (random() < 0.8) s += pick(spaces);
    }
    return s;
}

const fortunes = [];
for (const name of ['fortunes', 'computers', 'literature', 'linux', 'science'])
    fortunes.push(...fs.readFileSync(`/usr/share/games/fortunes/${name}`, 'utf8').split('\n%\n'));
const pieces = fortunes.slice(0, 1500).concat(Array.from({ length: 1500 }, line));

const text = [], lengths = [], ids = [];
for (const piece of pieces) {
    text.push(JSON.stringify(piece));
    lengths.push(Array.from(piece.matchAll(pattern), (m) => Buffer.byteLength(m[0])).join(' '));
    ids.push(encode(piece).join(' '));
}
fs.mkdirSync(out, { recursive: true });
fs.writeFileSync(path.join(out, 'text.jsonl'), text.join('\n') + '\n');
fs.writeFileSync(path.join(out, 'words.txt'), lengths.join('\n') + '\n');
fs.writeFileSync(path.join(out, 'ids.txt'), ids.join('\n') + '\n');
console.log(`${pieces.length} pieces written to ${out}`);
