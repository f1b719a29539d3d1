// cmd/flags.c — the one flag table (cmd/flags.h) and everything made from it: the parser every
// subcommand uses, --help, did-you-mean, the refusals of llama.cpp flags sift lacks, the old
// spellings, and the generated outputs (docs/usage.md's table, completions, man page, a flag list).
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../eval/eval.h"
#include "../util/check.h"
#include "../util/tunables.h"
#include "cmd.h"
#include "flags.h"

int flag_verbosity = 1;

#define R SUB_RUN
#define B SUB_BENCH
#define E SUB_EVAL
#define W SUB_SWEEP
#define P SUB_PPL
#define F SUB_FIT

// The subcommands: name, usage, what it does (help and man page).
static const struct {
    int sub;
    const char *name, *usage, *about, *examples;
} SUBS[FLAG_N_SUBS] = {
    {R, "", "sift [options] (-p TEXT | -f FILE... | --batch DIR | --prompts FILE.jsonl)",
     "Runs prompts through a Llama-family model with a long-context strategy: text on stdout, "
     "timing on stderr, or one JSON record per prompt and strategy. A comma list of strategies "
     "is an A/B comparison on the same tokens.",
     "sift -p \"What is the capital of France?\" --chat -n 32 --temp 0\n"
     "sift -m model.gguf -f prompt.txt -n 128 --temp 0.7 --top-p 0.9 --seed 7 --json\n"
     "sift --batch prompts/ --chat --temp 0 -n 64\n"
     "sift --prompts requests.jsonl --parallel 16 -o results.jsonl --resume\n"
     "sift -f long.txt --strategy full,speed,fastkv,specprefill -n 64 --temp 0\n"},
    {B, "bench", "sift bench [-m MODEL|synthetic:NAME[@SEED]] [-p 1024,8192] [-n 128] [-r 5] [options]",
     "Prefills N_PROMPT seeded random tokens per -p value, then decodes -n tokens at that depth; "
     "mean and sd of -r runs. 'x full' columns are ratios against full in the same run. MFU uses "
     "full-equivalent prefill FLOPs, MBU the weights + KV a decode step reads, both against "
     "ceilings the backend measures at start. --dry-run prints parameters, FLOPs and bytes by "
     "formula without loading weights. -t and --parallel take comma lists: the whole table once "
     "per thread count, B sequences decoded together.",
     "sift bench -p 512,2048 -n 128 -r 3 -t 2\n"
     "sift bench -p 4096 -n 32 --strategy full,fastkv,speed --format json\n"
     "sift bench -m synthetic:llama-3.1-8b -p 1024,131072 --dry-run\n"},
    {E, "eval", "sift eval [-m MODEL] [--strategy all|NAME,...] [--tasks niah,...] [--n-prompt 1024,2048,4096] [options]",
     "Long-context tasks in RULER's shapes generated from --seed (niah, multikey, multivalue, vt, "
     "cwe); each prompt fills --n-prompt tokens with the haystack, in the model's chat template. "
     "Every strategy runs greedily on the same tokens, full first as the reference; reported per "
     "strategy x task x length: accuracy, first-token and greedy agreement with full, KL, TTFT, "
     "TPOT, KV MiB. Ctrl-C reports what was measured.",
     "sift eval --strategy all --n-prompt 1024,2048,4096 --samples 5 -o r.json --plot r.svg\n"},
    {W, "sweep", "sift sweep [-m MODEL] (-f FILE... | --batch DIR | --prompts FILE.jsonl | --tasks LIST) [--grid SPEC | --strategy LIST] [options]",
     "Runs full once per prompt as the reference, then every setting of the grid greedily on the "
     "same tokens; reports agreement, KL, accuracy, speed and the Pareto frontier of fidelity "
     "against speedup. --grid 'fastkv:kv-rate=0.05,0.1;specprefill:keep=0.1,0.3;speed': "
     "strategies separated by ';', each NAME[:PARAM=V1,V2...], PARAM a strategy parameter "
     "without --. Default grid (L = the model's layers): speed speed-depth=ceil(0.75L),ceil(0.875L); "
     "fastkv kv-rate=0.05,0.1,0.2; specprefill keep=0.1,0.3 self-drafted and again with "
     "draft-layers=L (or draft=MODEL with --draft); topk budget=0.02,0.05; topk+phi budget=0.02; "
     "fastkv+topk; specprefill+topk+phi budget=0.02 (a strategy this build lacks is skipped with a "
     "note); --strategy LIST keeps those of it. --min-agreement X prints the fastest setting that keeps X as a command line.",
     "sift sweep -f long.txt --min-agreement 0.9 -o sweep.json --plot sweep.svg\n"
     "sift sweep --tasks niah,multikey --n-prompt 4096 --samples 2\n"},
    {P, "ppl", "sift ppl [-m MODEL] -f TEXT [-c 512] [options]",
     "Perplexity in llama-perplexity's convention: chunks of -c tokens, BOS at each chunk's "
     "start, the second half of each chunk scored.",
     "sift ppl -f wiki.test.raw -c 512\n"},
    {F, "fit-phi", "sift fit-phi [-m MODEL] --data TEXT -o FILE.phi [-c 1024] [options]",
     "Learns topk+phi's feature maps on the first -c tokens of TEXT (use them with --strategy "
     "topk+phi --phi FILE.phi); then checks them end to end on the text after (--check). The "
     "output is rewritten after every layer: rerun the same command to resume. --device is where "
     "the logging prefill runs (default cpu: fp32 logs); the fit itself runs on the CPU.",
     "sift fit-phi --data corpus.txt -c 1024 -o smollm2.phi\n"},
};

// The rows. A row with id FL_STRAT_OPT stands for the strategy parameters (policies/options.c).
static const flag_row BASE[] = {
    {FL_MODEL, SUB_ALL, "-m", "--model", NULL, "PATH", FT_PATH, 0, 0, NULL, NULL, "SIFT_MODEL",
     "GGUF file or Hugging Face directory (config.json, safetensors, tokenizer.json); bench also "
     "synthetic:NAME[@SEED] (default: " DEFAULT_MODEL " beside the binary)", 0, 0, "model and input", NULL},
    {FL_PROMPT, R, "-p", "--prompt", NULL, "TEXT", FT_STR, 0, 0, NULL, NULL, NULL,
     "prompt text (bench's -p is --n-prompt, as in llama-bench)", 0, 0, NULL, NULL},
    {FL_FILE, R | W | P, "-f", "--file", NULL, "PATH", FT_PATH, 0, 0, NULL, NULL, NULL,
     "prompt file ('-' = stdin), may be given several times; ppl: the text scored", 0, 0, NULL, NULL},
    {FL_BATCH, R | W, NULL, "--batch", NULL, "DIR", FT_PATH, 0, 0, NULL, NULL, NULL,
     "every .txt file in DIR, in name order, as prompts", 0, 0, NULL, NULL},
    {FL_PROMPTS, R | W, NULL, "--prompts", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "JSON Lines, one request per line ('-' = stdin): sift's fields id, prompt | messages, "
     "system, n_predict, temp, seed, strategy; or the OpenAI Batch API shape (custom_id, "
     "body.messages, body.max_tokens, body.temperature, ...)", 0, 0, NULL, NULL},
    {FL_CHAT, R | W, NULL, "--chat", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "wrap the prompt in the model's chat template", 0, 0, NULL, NULL},
    {FL_SYSTEM, R | W, NULL, "--system", "--system-prompt", "TEXT", FT_STR, 0, 0, NULL, NULL, NULL,
     "system message for --chat (implies --chat)", 0, 0, NULL, NULL},
    {FL_N_PREDICT, R | B | W, "-n", "--n-predict", "--n-gen", "N", FT_INT, -1, 1 << 30, NULL,
     "128|sweep=16", NULL, "tokens to generate (run: -1 = until end of text); bench: decoded at "
     "each prompt length (llama-bench's --n-gen)", 0, 0, "generation", NULL},
    {FL_CTX, SUB_ALL, "-c", "--ctx-size", NULL, "N", FT_INT, 0, MODEL_MAX_CTX, NULL,
     "0|ppl=512|fit-phi=1024", NULL, "context size: run, bench, eval, sweep: the longest prompt + "
     "answer and what the memory plan reserves (0 = the model's trained context); ppl: the chunk "
     "scored; fit-phi: the tokens of --data the fit reads", 0, 0, NULL, NULL},
    {FL_N_PROMPT, B | E | W, "-p", "--n-prompt", NULL, "N", FT_INT, 1, MODEL_MAX_CTX, NULL,
     "1024|eval=1024,2048,4096|sweep=4096", NULL, "prompt length in tokens: bench prefills that "
     "many random tokens (-p as in llama-bench), eval and sweep --tasks fill that many (prompt + "
     "answer); a comma list runs each", B | E, B, NULL, NULL},
    {FL_TEMP, R, NULL, "--temp", NULL, "T", FT_FLOAT, 0, 100, NULL, "0.8", NULL,
     "temperature (0 = greedy)", 0, 0, NULL, NULL},
    {FL_TOP_K, R, NULL, "--top-k", NULL, "K", FT_INT, 0, INT_MAX, NULL, "40", NULL,
     "keep the K most likely tokens (0 = off)", 0, 0, NULL, NULL},
    {FL_TOP_P, R, NULL, "--top-p", NULL, "P", FT_FLOAT, 1e-6, 1, NULL, "0.95", NULL,
     "nucleus sampling (1 = off)", 0, 0, NULL, NULL},
    {FL_MIN_P, R, NULL, "--min-p", NULL, "P", FT_FLOAT, 0, 1, NULL, "0.05", NULL,
     "drop tokens below P x the top probability", 0, 0, NULL, NULL},
    {FL_SEED, R | E | W | F, "-s", "--seed", NULL, "N", FT_INT, -1, UINT32_MAX, NULL,
     "-1|eval=1|sweep=1|fit-phi=1", NULL, "run: the sampling seed (-1 = random, reported); eval, "
     "sweep: the generated prompts' seed; fit-phi: every draw of the fit", 0, 0, NULL, NULL},
    {FL_STOP, R, "-r", "--stop", "--reverse-prompt", "STR", FT_STR, 0, 0, NULL, NULL, NULL,
     "end the answer before the first STR it produces; may be given several times; a --prompts "
     "request's own stop replaces them (-r and --reverse-prompt are llama-cli's names)", 0, 0,
     NULL, NULL},
    {FL_STRATEGY, R | B | E | W | P, NULL, "--strategy", NULL, "LIST", FT_NAMES, 0, 0, NULL,
     "full|eval=all|sweep=", NULL, "one strategy, or a comma list / all for an A/B comparison on "
     "the same tokens; or PREFILL+DECODE (e.g. fastkv+topk); sweep: those of the default grid; "
     "ppl: full only", 0, 0, "strategy and device", NULL},
    {FL_REPEAT, R | B, "-r", "--repeat", "--repetitions", "N", FT_INT, 1, 1000, NULL, "1|bench=5",
     NULL, "run each strategy N times per prompt (run: rotating order after an untimed warm-up, "
     "medians and spreads; bench: mean and sd); -r in bench only, as in llama-bench (run's -r is "
     "--stop, as in llama-cli)", 0, B, NULL, NULL},
    {FL_DEVICE, SUB_ALL, NULL, "--device", NULL, "D", FT_ENUM, 0, 0, "auto|cpu|cuda",
     "auto|fit-phi=cpu", NULL, "auto: cuda when a GPU is usable (--device cuda says why one is "
     "not)", 0, 0, NULL, NULL},
    {FL_THREADS, SUB_ALL, "-t", "--threads", NULL, "N", FT_INT, 1, 1024, NULL, NULL,
     "OMP_NUM_THREADS", "CPU threads (default: $OMP_NUM_THREADS, else the physical cores less "
     "those busy; more than the CPUs warns); bench: a comma list, the table once per count", B, 0,
     NULL, NULL},
    {FL_WEIGHTS, SUB_ALL, NULL, "--weights", NULL, "W", FT_ENUM, 0, 0, "native|fast|exact|f32",
     "native", NULL, "CPU weights: native (as stored) | fast (8-bit activations, llama.cpp's "
     "precision: AVX-512 VNNI in prefill, the row kernels in decode) | exact (16-bit activations) "
     "| f32 (dequantised, the reference)", 0, 0, NULL, NULL},
    {FL_WTYPE, B, NULL, "--wtype", NULL, "T", FT_ENUM, 0, 0,
     "f32|f16|bf16|q8_0|q4_0|q4_1|q5_0|q5_1|q4_k|q5_k|q6_k", "f32", NULL,
     "a synthetic model's matrices as random blocks of that type", 0, 0, NULL, NULL},
    {FL_CACHE_TYPE_K, R | B | E | W | P, NULL, "--cache-type-k", "-ctk", "T", FT_ENUM, 0, 0,
     "auto|f32|bf16|f16|q8_0", "auto", NULL, "KV cache keys: auto (f16 on the CPU, as close to f32 "
     "in perplexity and retrieval and faster at depth; bf16 on CUDA) | f32 | bf16 | f16 (2 bytes, "
     "rounded to nearest even) | q8_0 (GGUF's blocks: 32 int8 and an f16 scale, 34 bytes per 32; "
     "head_dim a multiple of 32). CUDA takes bf16 only",
     0, 0, NULL, NULL},
    {FL_CACHE_TYPE_V, R | B | E | W | P, NULL, "--cache-type-v", "-ctv", "T", FT_ENUM, 0, 0,
     "auto|f32|bf16|f16|q8_0", "auto", NULL, "KV cache values: as --cache-type-k", 0, 0, NULL,
     NULL},
    {FL_PARALLEL, R | B | W, NULL, "--parallel", NULL, "N", FT_INT, 1, FWD_MAX_BATCH, NULL, "1",
     NULL, "run: up to N prompts in flight, each decode step one pass over all; sweep: N settings "
     "of a prompt decoded as one batch; bench: a comma list of sequences decoded together", B, 0,
     NULL, NULL},
    {FL_UBATCH, R | B | E | W, "-ub", "--ubatch", "--ubatch-size", "N", FT_INT, 0, MODEL_MAX_CTX,
     NULL, PREFILL_UBATCH_TEXT, NULL, "rows of one prefill pass: a longer prompt runs in chunks of N rows "
     "appending to its cache, in activation memory for N rows (the memory plan counts them); "
     "strategies full, topk and topk+phi (the others one pass); 0: one pass", 0, 0, NULL, NULL},
    {FL_STRAT_OPT, SUB_STRATS, NULL, NULL, NULL, NULL, FT_STRAT, 0, 0, NULL, NULL, NULL, NULL, 0,
     0, "strategy parameters (defaults from each strategy's paper)", NULL},
    {FL_TASKS, E | W, NULL, "--tasks", NULL, "LIST", FT_NAMES, 0, 0, NULL, "|eval=all", NULL,
     "generated tasks (niah, multikey, multivalue, vt, cwe; all: every one)", 0, 0,
     "tasks and sweeps", NULL},
    {FL_SAMPLES, E | W, NULL, "--samples", NULL, "N", FT_INT, 1, 100000, NULL, "5|sweep=2", NULL,
     "prompts per task and length", 0, 0, NULL, NULL},
    {FL_HAYSTACK, E | W, NULL, "--haystack", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "the filler text's sentences (default: built in)", 0, 0, NULL, NULL},
    {FL_QUERY_AGNOSTIC, E, NULL, "--query-agnostic", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "snapkv, streamingllm and fastkv (and their compositions) compress the context without the "
     "question, which is prefilled after it (a batch job's --prefix-cache on); the others run as "
     "without", 0, 0, NULL, NULL},
    {FL_DUMP, E, NULL, "--dump-prompts", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "print the prompts (JSON Lines) without running any strategy", 0, 0, NULL, NULL},
    {FL_GRID, W, NULL, "--grid", NULL, "SPEC", FT_STR, 0, 0, NULL, NULL, NULL,
     "the settings: NAME[:PARAM=V,...] entries separated by ';'", 0, 0, NULL, NULL},
    {FL_FIDELITY, W, NULL, "--fidelity", NULL, "F", FT_ENUM, 0, 0, "greedy|first|accuracy",
     "greedy", NULL, "the frontier's fidelity", 0, 0, NULL, NULL},
    {FL_SPEED, W, NULL, "--speed", NULL, "S", FT_ENUM, 0, 0, "total|ttft|tpot", "total", NULL,
     "the frontier's speedup", 0, 0, NULL, NULL},
    {FL_MIN_AGREE, W, NULL, "--min-agreement", NULL, "X", FT_FLOAT, 0, 1, NULL, NULL, NULL,
     "print the fastest setting whose fidelity is at least X", 0, 0, NULL, NULL},
    {FL_BENCH_PREFIX, B, NULL, "--prefix", NULL, "N", FT_INT, 0, MODEL_MAX_CTX, NULL, "0", NULL,
     "a reuse row for each strategy that can take a shared prefix: the prompt's first N tokens "
     "prefilled once, untimed (a batch job's --prefix-cache: exact for full, topk, topk+phi; "
     "compressed for snapkv, streamingllm, fastkv), the rest prefilled after them", 0, 0, NULL, NULL},
    {FL_DRY_RUN, B, NULL, "--dry-run", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "parameters, FLOPs and bytes by formula, without loading weights", 0, 0, "bench and ppl", NULL},
    {FL_ELEM_BYTES, B, NULL, "--elem-bytes", NULL, "N", FT_INT, 1, 8, NULL, "4", NULL,
     "--dry-run's bytes per parameter, activation and KV element (not given: the weights as "
     "kept, the KV cache as --cache-type-k/-v)", 0, 0, NULL, NULL},
    {FL_RATES, B, NULL, "--rates", NULL, "R", FT_STR, 0, 0, NULL, NULL, NULL,
     "--dry-run's rates for the predicted TTFT and TPOT per strategy: h200 (measured, "
     "bench/CUDA.md; the default with --device cuda) or GEMM_TFLOPS,ATTN_TFLOPS,WEIGHT_GBS,KV_GBS", 0, 0, NULL, NULL},
    {FL_CHUNKS, P, NULL, "--chunks", NULL, "N", FT_INT, 1, INT_MAX, NULL, NULL, NULL,
     "score at most the first N chunks (default: all; llama-perplexity's --chunks)", 0, 0, NULL, NULL},
    {FL_DATA, F, NULL, "--data", NULL, "TEXT", FT_PATH, 0, 0, NULL, NULL, NULL,
     "the text the maps are fitted on", 0, 0, "fit-phi", NULL},
    {FL_STEPS, F, NULL, "--steps", NULL, "N", FT_INT, 1, 1 << 20, NULL, "150", NULL,
     "Adam steps per layer", 0, 0, NULL, NULL},
    {FL_QUERIES, F, NULL, "--queries", NULL, "N", FT_INT, 4, 1 << 16, NULL, "48", NULL,
     "sampled query positions", 0, 0, NULL, NULL},
    {FL_FIT_BATCH, F, NULL, "--fit-batch", NULL, "N", FT_INT, 1, 1 << 16, NULL, "16", NULL,
     "queries per Adam step (was --batch)", 0, 0, NULL, NULL},
    {FL_LR, F, NULL, "--lr", NULL, "X", FT_FLOAT, 1e-7, 1, NULL, "0.003", NULL, "learning rate",
     0, 0, NULL, NULL},
    {FL_D_PHI, F, NULL, "--d-phi", NULL, "N", FT_INT, 1, 4096, NULL, NULL, NULL,
     "feature dimension (default: the head dimension)", 0, 0, NULL, NULL},
    {FL_CALIBRATE, F, NULL, "--calibrate", NULL, "F", FT_FLOAT, 0, 0.5, NULL, "0.02", NULL,
     "calibrate each head's log-mass error without its top F share of keys", 0, 0, NULL, NULL},
    {FL_MARGIN, F, NULL, "--margin", NULL, "M", FT_FLOAT, 0, 10, NULL, "1", NULL,
     "shift that error to mean -M standard deviations", 0, 0, NULL, NULL},
    {FL_POSITIONS, F, NULL, "--positions", NULL, "N", FT_INT, 64, 1 << 26, NULL, NULL, NULL,
     "shift the data's positions up to N - ctx (default: the model's context)", 0, 0, NULL, NULL},
    {FL_CHECK, F, NULL, "--check", NULL, "N", FT_INT, 0, 1 << 20, NULL, "4096", NULL,
     "decode up to N held-out tokens with the maps vs the fallbacks (0: no check)", 0, 0, NULL, NULL},
    {FL_RECAL, F, NULL, "--recalibrate", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "keep -o's maps, redo only the calibration and the check", 0, 0, NULL, NULL},
    {FL_VERIFY, F, NULL, "--verify", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "keep -o's maps as they are, run only the check", 0, 0, NULL, NULL},
    {FL_RESUME, R, NULL, "--resume", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "keep every valid record -o FILE already has, run and append the rest", 0, 0, "batch jobs", NULL},
    {FL_ERRORS, R, NULL, "--errors", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "the failed requests' records go to FILE (the Batch API's error file)", 0, 0, NULL, NULL},
    {FL_RETRY, R, NULL, "--retry-failed", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "with --resume: run the failed requests again", 0, 0, NULL, NULL},
    {FL_WAIT_LOCK, R, NULL, "--wait-lock", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "when another sift writes -o FILE, wait for it instead of refusing", 0, 0, NULL, NULL},
    {FL_SHARD, R, NULL, "--shard", NULL, "K/N", FT_STR, 0, 0, NULL, NULL, NULL,
     "run the K-th (0-based) of N contiguous slices of the input", 0, 0, NULL, NULL},
    {FL_UNORDERED, R, NULL, "--unordered", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "write each record when it finishes, not in input order", 0, 0, NULL, NULL},
    {FL_PREFIX_CACHE, R, NULL, "--prefix-cache", NULL, "M", FT_ENUM, 0, 0, "auto|on|off", "auto",
     NULL, "requests whose tokens start alike (one document, many questions) prefill the shared "
     "part once and each its own rest: auto: strategies full, topk, topk+phi and full+Y (answers as "
     "without), but not in an A/B comparison (each strategy's TTFT its own); on: those, and the "
     "shared part compressed once by snapkv, streamingllm or fastkv, query-agnostically (labelled), "
     "in an A/B comparison too", 0, 0, NULL, NULL},
    {FL_PREFIX_MIN, R, NULL, "--prefix-min", NULL, "N", FT_INT, 1, MODEL_MAX_CTX, NULL, "256", NULL,
     "the fewest shared tokens worth a shared prefix", 0, 0, NULL, NULL},
    {FL_PROMPT_CACHE, R, NULL, "--prompt-cache", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "a prompt's plain prefill on disk (llama.cpp's name): a prompt that starts with FILE's tokens "
     "loads them and prefills only the rest; the run's first prompt is saved to FILE when it does "
     "not hold it (full, topk, topk+phi); a FILE of another model, cache type, backend, --weights "
     "or --ubatch, or a damaged one, is refused", 0, 0, NULL, NULL},
    {FL_PROMPT_CACHE_RO, R, NULL, "--prompt-cache-ro", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "read --prompt-cache FILE, never write it", 0, 0, NULL, NULL},
    {FL_KEPT_MAP, R, NULL, "--kept-map", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "draw what each strategy kept into FILE (an HTML page) and FILE.json", 0, 0, NULL, NULL},
    {FL_SUMMARY, R, NULL, "--summary", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "the run's summary (prompts, failures, tokens, rates) as one JSON object", 0, 0, NULL, NULL},
    {FL_OUTPUT, SUB_ALL, "-o", "--output", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "the output file: run: the JSON records (an existing file only with --resume; FILE.lock "
     "holds the pid); bench: the table; eval, sweep: the JSON report; ppl: the result; fit-phi: "
     "the maps (.phi)", 0, 0, "output", NULL},
    {FL_FORMAT, B, NULL, "--format", NULL, "F", FT_ENUM, 0, 0, "md|json|jsonl|csv", "md", NULL,
     "the table's format (was -o)", 0, 0, NULL, NULL},
    {FL_CSV, E | W, NULL, "--csv", NULL, "FILE", FT_PATH, 0, 0, NULL, NULL, NULL,
     "the records as CSV", 0, 0, NULL, NULL},
    {FL_PLOT, E | W, NULL, "--plot", NULL, "FILE.svg", FT_PATH, 0, 0, NULL, NULL, NULL,
     "an SVG scatter of fidelity against speed", 0, 0, NULL, NULL},
    {FL_JSON, R | P, NULL, "--json", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "run: one JSON object per prompt and strategy (JSON Lines) on stdout; ppl: the result as "
     "JSON", 0, 0, NULL, NULL},
    {FL_OUTPUT_FORMAT, R, NULL, "--output-format", NULL, "F", FT_ENUM, 0, 0, "auto|sift|openai",
     "auto", NULL, "the JSON records' shape: sift | openai (the Batch API's output objects; one "
     "strategy) | auto (openai when every --prompts line is a Batch API request)", 0, 0, NULL, NULL},
    {FL_QUIET, SUB_ALL, "-q", "--quiet", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "verbosity 0: errors and results only (1, the default: plus progress and timings)", 0, 0,
     NULL, NULL},
    {FL_VERBOSE, SUB_ALL, "-v", "--verbose", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "verbosity 2: plus notes and every flag's value as parsed; -vv (3): plus the table row each flag given matched", 0, 0,
     NULL, NULL},
    {FL_HELP, SUB_ALL, "-h", "--help", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "this help", 0, 0, NULL, NULL},
    {FL_VERSION, R, NULL, "--version", NULL, NULL, FT_SWITCH, 0, 0, NULL, NULL, NULL,
     "version and backends; sift help [SUBCOMMAND] is SUBCOMMAND's --help; sift --help-markdown, "
     "--list-flags, --completion bash|zsh|fish and --man print this table in other forms", 0, 0,
     NULL, NULL},
};
#define N_BASE (int)(sizeof BASE / sizeof *BASE)

// llama.cpp flags sift does not have, each with what to use instead.
static const struct {
    const char *names, *instead;
} LLAMA[] = {
    {"-ngl|--n-gpu-layers|--gpu-layers", "use --device cuda (the whole model runs on the GPU)"},
    {"-e|--escape", "the prompt is taken as given (no escapes); put newlines in a -f FILE"},
    {"--no-display-prompt", "sift never prints the prompt: stdout has the answer alone"},
    {"-cnv|--conversation|-i|--interactive|-if|--interactive-first|-no-cnv",
     "sift is not interactive: use --chat with -p or -f, or --prompts FILE.jsonl for many"},
    {"--mlock|--no-mmap|--mmap", "sift maps the model read-only itself; there is nothing to set"},
    {"-fa|--flash-attn", "sift's attention is always fused; there is nothing to set"},
    {"--repeat-penalty|--repeat-last-n",
     "sift has no multiplicative repeat penalty; a --prompts request may set OpenAI's "
     "frequency_penalty and presence_penalty"},
    {"-b|--batch-size", "sift sizes prompt batches itself; --parallel N sets the prompts in "
     "flight, --ubatch N the rows of one prefill pass"},
    {"--log-disable", "use -q"},
    {"-co|--color", "sift's output is plain text"},
};

// Old spellings: kept (a warning) where the meaning stayed, refused where it changed.
static const struct {
    const char *old;
    unsigned subs;
    flag_id now;
    int refused;
    const char *why;
} OLD[] = {
    {"--ctx", B | E | W, FL_N_PROMPT, 0, "the prompt length"},
    {"--ctx", P | F, FL_CTX, 0, "the context size"},
    {"--reps", B, FL_REPEAT, 0, "the repetitions"},
    {"--out", F, FL_OUTPUT, 0, "the output file"},
    {"--batch", F, FL_FIT_BATCH, 1, "--batch names a prompt directory in run and sweep"},
};

// ---- the rows: BASE with the strategy parameters in place of FL_STRAT_OPT ----

static flag_row ROWS[128];
static int N_ROWS;

static void rows_init(void) {
    if (N_ROWS) return;
    for (int i = 0; i < N_BASE; i++) {
        if (BASE[i].id != FL_STRAT_OPT) {
            ROWS[N_ROWS++] = BASE[i];
            continue;
        }
        int n;
        const opt_def *t = strategy_opts_table(&n);
        for (int k = 0; k < n && N_ROWS < (int)(sizeof ROWS / sizeof *ROWS); k++) {
            static char defs[64][64];
            if (t[k].def_text) snprintf(defs[k], sizeof defs[k], "%s", t[k].def_text);
            else if (t[k].type == OPT_CHOICE)
                snprintf(defs[k], sizeof defs[k], "%.*s", (int)strcspn(t[k].choices, "="), t[k].choices);
            else if (t[k].type == OPT_PATH) defs[k][0] = 0;
            else snprintf(defs[k], sizeof defs[k], "%g", t[k].def);
            // fit-phi reads topk+phi's anchors too (the same meaning: the tokens read exactly)
            unsigned subs = BASE[i].subs | (strcmp(t[k].flag, "--sink") == 0 ||
                                            strcmp(t[k].flag, "--tail") == 0 ? F : 0);
            ROWS[N_ROWS++] = (flag_row){FL_STRAT_OPT, subs, NULL, t[k].flag, NULL, t[k].metavar,
                                        FT_STRAT, t[k].lo, t[k].hi, NULL, defs[k][0] ? defs[k] : NULL,
                                        NULL, t[k].help, 0, 0, k ? NULL : BASE[i].section, &t[k]};
        }
    }
}

static int sub_index(int sub) {
    for (int i = 0; i < FLAG_N_SUBS; i++)
        if (SUBS[i].sub == sub) return i;
    return 0;
}

static const char *sub_word(int sub) { return sub == R ? "run" : SUBS[sub_index(sub)].name; }

// Does name match a (one of its names in sub)?
static int row_named(const flag_row *r, int sub, const char *a) {
    if (r->s && (!r->short_subs || (r->short_subs & sub)) && strcmp(a, r->s) == 0) return 1;
    return (r->l && strcmp(a, r->l) == 0) || (r->alias && strcmp(a, r->alias) == 0);
}

static const flag_row *find_row(int sub, const char *a) {
    for (int i = 0; i < N_ROWS; i++)
        if ((ROWS[i].subs & sub) && row_named(&ROWS[i], sub, a)) return &ROWS[i];
    return NULL;
}

static const flag_row *row_of(flag_id id) {
    for (int i = 0; i < N_ROWS; i++)
        if (ROWS[i].id == id) return &ROWS[i];
    return NULL;
}

// The default of r in sub ("128|sweep=16": 16 in sweep, 128 elsewhere), or NULL.
static const char *row_default(const flag_row *r, int sub, char *buf, size_t len) {
    if (!r->def) return NULL;
    const char *name = sub_word(sub);
    size_t n = strlen(name);
    for (const char *p = strchr(r->def, '|'); p; p = strchr(p + 1, '|'))
        if (strncmp(p + 1, name, n) == 0 && p[1 + n] == '=') {
            snprintf(buf, len, "%.*s", (int)strcspn(p + 2 + n, "|"), p + 2 + n);
            return buf[0] ? buf : NULL;
        }
    snprintf(buf, len, "%.*s", (int)strcspn(r->def, "|"), r->def);
    return buf[0] ? buf : NULL;
}

// ---- errors: did you mean, the subcommands that take a flag, llama.cpp's flags ----

// The names sub takes, separated by spaces, into buf.
static const char *sub_flag_names(int sub, char *buf, size_t len) {
    size_t j = 0;
    buf[0] = 0;
    for (int i = 0; i < N_ROWS && j < len; i++) {
        const flag_row *r = &ROWS[i];
        if (!(r->subs & sub)) continue;
        const char *names[3] = {r->l, r->alias, !r->short_subs || (r->short_subs & sub) ? r->s : NULL};
        for (int k = 0; k < 3 && j < len; k++)
            if (names[k]) j += (size_t)snprintf(buf + j, len - j, "%s ", names[k]);
    }
    return buf;
}

static void unknown_flag(int sub, const char *a) {
    const char *eq = strchr(a, '=');
    if (eq && a[1] != '-') {   // -ctk=f16: NAME=VALUE is for the --long names
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq - a), a);
        const flag_row *r = find_row(sub, name);
        if (r && r->type != FT_SWITCH)
            cli_usage_error("'%s': NAME=VALUE is for the --long names: %s=%s or %s %s", a, r->l,
                            eq + 1, name, eq + 1);
    }
    for (size_t i = 0; i < sizeof LLAMA / sizeof *LLAMA; i++) {
        const char *p = LLAMA[i].names;
        for (size_t n = strlen(a); *p; p += strcspn(p, "|"), p += *p == '|')
            if (strcspn(p, "|") == n && strncmp(p, a, n) == 0)
                cli_usage_error("%s is llama.cpp's; sift has no such flag: %s", a, LLAMA[i].instead);
    }
    char others[128] = "";
    for (int i = 0; i < N_ROWS; i++)
        for (int k = 0; k < FLAG_N_SUBS; k++)
            if ((ROWS[i].subs & SUBS[k].sub) && row_named(&ROWS[i], SUBS[k].sub, a) &&
                !((ROWS[i].subs & sub) && row_named(&ROWS[i], sub, a)) &&
                !strstr(others, sub_word(SUBS[k].sub)))
                snprintf(others + strlen(others), sizeof others - strlen(others), "%ssift %s",
                         others[0] ? ", " : "", SUBS[k].sub == R ? "(run)" : SUBS[k].name);
    if (others[0]) cli_usage_error("sift%s%s does not take %s (a flag of: %s)", sub == R ? "" : " ",
                                   SUBS[sub_index(sub)].name, a, others);
    static char names[8192];
    char hint[200];
    cli_suggest(a, sub_flag_names(sub, names, sizeof names), 0, hint, sizeof hint);
    cli_usage_error("unknown flag '%s'%s%s", a, hint[0] ? "; " : "", hint);
}

// ---- parsing ----

// "1,2,4" into v->list (each in [lo, hi]); a usage error on bad input.
static void int_list(const char *flag, const char *s, const flag_row *r, flag_val *v, int check) {
    v->n = 0;
    for (const char *p = s;;) {
        size_t len = strcspn(p, ",");
        char item[32];
        if (len == 0 || len >= sizeof item) cli_usage_error("%s '%s': an empty or overlong entry", flag, s);
        if (v->n == FLAG_MAX_LIST) cli_usage_error("%s: more than %d values", flag, FLAG_MAX_LIST);
        memcpy(item, p, len);
        item[len] = 0;
        v->list[v->n++] = (int)cli_int(flag, item, check ? (long long)r->lo : INT_MIN,
                                       check ? (long long)r->hi : INT_MAX);
        if (!p[len]) break;
        p += len + 1;
    }
    v->i = v->list[0];
}

// One value of r (text s) into f; check: the range (not for a default).
static void set_value(flag_set *f, const flag_row *r, const char *flag, const char *s, int check) {
    if (r->type == FT_STRAT) {
        char err[256];
        char hint[160] = "";
        if (strategy_opt_set(&f->so, r->opt, s, err, sizeof err)) {
            if (r->opt->type == OPT_CHOICE) cli_suggest(s, r->metavar, 1, hint, sizeof hint);
            cli_usage_error("%s%s%s", err, hint[0] ? "; " : "", hint);
        }
        if (check && f->n_sp < (int)(sizeof f->sp / sizeof *f->sp))
            f->sp[f->n_sp].d = r->opt, f->sp[f->n_sp++].v = s;
        return;
    }
    flag_val *v = &f->v[r->id];
    v->s = s;
    if (check && r->id == FL_FILE) {
        if (f->n_files == (int)(sizeof f->files / sizeof *f->files))
            cli_usage_error("%s: more than %d files (name a directory with --batch)", flag, f->n_files);
        f->files[f->n_files++] = s;
    }
    if (check && r->id == FL_STOP && *s) {
        if (f->n_stops == (int)(sizeof f->stops / sizeof *f->stops))
            cli_usage_error("%s: more than %d stop strings", flag, f->n_stops);
        f->stops[f->n_stops++] = s;
    }
    if (r->type == FT_INT && (r->list_subs & f->sub)) int_list(flag, s, r, v, check);
    else if (r->type == FT_INT) {
        if (check && strchr(s, ','))
            cli_usage_error("%s takes one value in sift %s (a list in: bench)", flag, sub_word(f->sub));
        v->i = cli_int(flag, s, check ? (long long)r->lo : LLONG_MIN, check ? (long long)r->hi : LLONG_MAX);
        v->list[0] = (int)v->i, v->n = 1;
    } else if (r->type == FT_FLOAT)
        v->f = cli_float(flag, s, check ? r->lo : -1e300, check ? r->hi : 1e300);
    else if (r->type == FT_ENUM) {
        size_t n = strlen(s);
        int k = 0;
        for (const char *p = r->choices; *p; p += strcspn(p, "|"), p += *p == '|', k++)
            if (strcspn(p, "|") == n && strncmp(p, s, n) == 0) {
                v->i = k;
                return;
            }
        char names[160], hint[160];
        snprintf(names, sizeof names, "%s", r->choices);
        for (char *c = strchr(names, '|'); c; c = strchr(c, '|')) memmove(c + 2, c + 1, strlen(c)), c[0] = ',', c[1] = ' ';
        cli_suggest(s, r->choices, 1, hint, sizeof hint);
        cli_usage_error("%s must be one of %s (got '%s')%s%s", flag, names, s, hint[0] ? "; " : "", hint);
    } else if (check && (r->type == FT_STR || r->type == FT_PATH || r->type == FT_NAMES) && !*s)
        cli_usage_error("%s needs a value (got an empty one)", flag);
}

// The name of r that a is (a static string): its short name, alias or long name.
static const char *row_spelling(const flag_row *r, const char *a) {
    if (r->s && strcmp(a, r->s) == 0) return r->s;
    return r->alias && strcmp(a, r->alias) == 0 ? r->alias : r->l;
}

#define SUB_NAMES "run bench eval sweep ppl fit-phi help"

static void print_version(void) {
    printf("sift %s (backends: %s)\n", SIFT_VERSION, CLI_BACKENDS);
    exit(cli_finish_stdout(0));
}

static int top_output(const char *a, const char *eq, const char *next);

void flags_parse(flag_set *f, int sub, int argc, char **argv, int first) {
    rows_init();
    static char help_name[40];
    snprintf(help_name, sizeof help_name, "sift%s%s", sub == R ? "" : " ", SUBS[sub_index(sub)].name);
    cli_help_name = help_name;
    *f = (flag_set){.sub = sub, .name = SUBS[sub_index(sub)].name, .so = strategy_opts_default()};
    // the defaults: a row's SIFT_ variable (its environment column) where set, else the row's own
    // (OMP_NUM_THREADS is the CPU backend's to read: -t's default 0 means it)
    for (int i = 0; i < N_ROWS; i++) {
        char buf[64];
        const char *d = ROWS[i].subs & sub ? row_default(&ROWS[i], sub, buf, sizeof buf) : NULL, *e;
        if (ROWS[i].subs & sub && ROWS[i].env && strncmp(ROWS[i].env, "SIFT_", 5) == 0 &&
            (e = getenv(ROWS[i].env)) && *e)
            d = e;
        static char keep[FL_COUNT][64];   // the default's text, as the value's
        if (d && ROWS[i].type != FT_STRAT) {
            snprintf(keep[ROWS[i].id], sizeof keep[0], "%s", d);
            set_value(f, &ROWS[i], ROWS[i].l, keep[ROWS[i].id], 0);
        }
    }
    int verbose = 0;
    const char *r_digits = NULL;   // run's -r given digits: a stop string now, said once
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *eq = NULL;   // eq: the value of --flag=value
        char name[64];
        if (a[0] == '-' && a[1] == '-' && strchr(a, '=') && strcspn(a, "=") < sizeof name) {
            snprintf(name, sizeof name, "%.*s", (int)strcspn(a, "="), a);
            eq = a + strlen(name) + 1, a = name;
        }
        if (sub == R && i == first && top_output(a, eq, i + 1 < argc ? argv[i + 1] : NULL))
            exit(cli_finish_stdout(0));
        for (int k = 1; sub == R && k < FLAG_N_SUBS; k++)
            if (strcmp(a, SUBS[k].name) == 0)
                cli_usage_error("unexpected argument '%s': a subcommand comes first (sift %s ...)", a, a);
        if (a[0] != '-' || !a[1]) {
            char hint[160];
            if (sub == R && i == first && *cli_suggest(a, SUB_NAMES, 1, hint, sizeof hint))
                cli_usage_error("unknown subcommand '%s'; %s", a, hint);
            cli_usage_error("unexpected argument '%s'", a);
        }
        if (strcmp(a, "-vv") == 0) {
            verbose += 2;
            continue;
        }
        const flag_row *r = find_row(sub, a);
        const char *as = r ? row_spelling(r, a) : NULL;   // a, as a string that outlives argv[i]'s copy
        for (size_t k = 0; !r && k < sizeof OLD / sizeof *OLD; k++)
            if ((OLD[k].subs & sub) && strcmp(a, OLD[k].old) == 0) {
                const flag_row *now = row_of(OLD[k].now);
                if (OLD[k].refused)
                    cli_usage_error("%s is now %s in sift %s: %s", a, now->l, sub_word(sub), OLD[k].why);
                fprintf(stderr, "sift: warning: %s is now %s (%s); the old name still works\n", a,
                        now->l, OLD[k].why);
                r = now, as = OLD[k].old;
            }
        if (!r) unknown_flag(sub, a);
        if (r->type == FT_SWITCH) {
            if (eq) cli_usage_error("%s is a switch: it takes no value (got '%s')", as, argv[i]);
            f->v[r->id].given++;
            f->v[r->id].i++;
            if (r->id == FL_VERBOSE) verbose++;
            if (r->id == FL_HELP) {
                flags_help(stdout, sub);
                exit(cli_finish_stdout(0));
            }
            if (r->id == FL_VERSION) print_version();
            continue;
        }
        if (!eq && i + 1 >= argc) cli_usage_error("%s needs a value", as);
        const char *val = eq ? eq : argv[++i];
        if (r->type != FT_STRAT) f->v[r->id].given++;
        set_value(f, r, as, val, 1);
        if (r->id == FL_STOP && strcmp(as, "-r") == 0 && !r_digits && val[strspn(val, "0123456789")] == 0)
            r_digits = val;
        if (f->n_trace < (int)(sizeof f->trace / sizeof *f->trace))   // for -vv
            f->trace[f->n_trace].as = as, f->trace[f->n_trace].row = r->l, f->trace[f->n_trace++].v = val;
    }
    flag_verbosity = f->v[FL_QUIET].given ? 0 : verbose > 2 ? 3 : 1 + verbose;
    if (f->v[FL_QUIET].given && verbose) cli_usage_error("-q and -v exclude each other");
    if (r_digits && flag_verbosity > 0)   // sift -r 3 meant repetitions before -r was llama-cli's
        fprintf(stderr, "sift: note: -r is --reverse-prompt (llama-cli's) in sift run: '%s' is a stop "
                        "string; for repetitions use --repeat %s\n", r_digits, r_digits);
    for (int k = 0; f->v[FL_THREADS].given && k < f->v[FL_THREADS].n; k++)   // more than the CPUs
        cli_threads_check("-t", f->v[FL_THREADS].list[k]);
}

void flags_check_strategy_params(const flag_set *f, const strategy *const *list, int n) {
    for (int k = 0; k < f->n_sp; k++) {
        int used = 0;
        for (int i = 0; i < n && !used; i++) used = strategy_opt_used_by(f->sp[k].d, list[i]->name);
        if (used) continue;
        char names[200] = "";
        for (int i = 0; i < n; i++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? ", " : "", list[i]->name);
        fprintf(stderr, "sift: warning: %s is read by %s; no chosen strategy (%s) reads it: ignored\n",
                f->sp[k].d->flag, f->sp[k].d->used_by, names);
    }
}

// An input file given on the command line: readable and not a directory ('-': stdin), else a usage
// error.
static void check_input(const char *flag, const char *path) {
    struct stat st;
    if (strcmp(path, "-") == 0) return;
    if (stat(path, &st) != 0 || access(path, R_OK) != 0)
        cli_usage_error("cannot read %s '%s': %s", flag, path, strerror(errno));
    if (S_ISDIR(st.st_mode)) cli_usage_error("%s '%s' is a directory, not a file", flag, path);
}

void flags_done(const flag_set *f) {
    if (flag_verbosity >= 2) {   // every flag's value as parsed: what the run will use
        fprintf(stderr, "sift: %s flags:", sub_word(f->sub));
        for (int i = 0; i < N_ROWS; i++) {
            const flag_row *r = &ROWS[i];
            if (!(r->subs & f->sub) || r->type == FT_SWITCH || r->type == FT_STRAT) continue;
            if (f->v[r->id].s) fprintf(stderr, " %s %s%s", r->l, f->v[r->id].s, f->v[r->id].given ? "" : "*");
        }
        for (int k = 0; k < f->n_sp; k++) fprintf(stderr, " %s %s", f->sp[k].d->flag, f->sp[k].v);
        fprintf(stderr, " (* = default)\n");
    }
    for (int k = 0; flag_verbosity >= 3 && k < f->n_trace; k++)   // -vv: how each flag was read
        fprintf(stderr, "sift: %s: '%s %s' read as %s\n", sub_word(f->sub), f->trace[k].as,
                f->trace[k].v, f->trace[k].row);
    if (tunables()->parse_only) {
        fprintf(stderr, "sift: %s: the command line parses (SIFT_PARSE_ONLY=1)\n", sub_word(f->sub));
        exit(cli_finish_stdout(0));
    }
    for (int k = 0; k < f->n_files; k++) check_input("-f", f->files[k]);
    static const flag_id INPUTS[] = {FL_PROMPTS, FL_HAYSTACK, FL_DATA};
    for (size_t k = 0; k < sizeof INPUTS / sizeof *INPUTS; k++)
        if (f->v[INPUTS[k]].given) check_input(row_of(INPUTS[k])->l, f->v[INPUTS[k]].s);
}

void flags_help_command(int argc, char **argv) {
    rows_init();
    cli_help_name = "sift";
    const char *a = argc > 2 ? argv[2] : "run";
    if (argc > 3) cli_usage_error("sift help takes one subcommand (got '%s' after '%s')", argv[3], a);
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) a = "run";
    for (int k = 0; k < FLAG_N_SUBS; k++)
        if (strcmp(a, sub_word(SUBS[k].sub)) == 0) {
            flags_help(stdout, SUBS[k].sub);
            exit(cli_finish_stdout(0));
        }
    char hint[160];
    cli_suggest(a, SUB_NAMES, 1, hint, sizeof hint);
    cli_usage_error("unknown subcommand '%s'%s%s; sift help takes run, bench, eval, sweep, ppl or "
                    "fit-phi", a, hint[0] ? "; " : "", hint);
}

// ---- help and the generated forms ----

// "-n, --n-predict N" for sub (a list: "N,...")
static void row_head(const flag_row *r, int sub, char *buf, size_t len) {
    int shrt = r->s && (!r->short_subs || (r->short_subs & sub));
    snprintf(buf, len, "%s%s%s%s%s%s", shrt ? r->s : "", shrt ? ", " : "    ", r->l,
             r->metavar ? " " : "", r->metavar ? r->metavar : "",
             r->type == FT_INT && (r->list_subs & sub) ? ",..." : "");
}

static void row_text(const flag_row *r, int sub, char *buf, size_t len) {
    char d[64];
    const char *def = row_default(r, sub, d, sizeof d);
    snprintf(buf, len, "%s%s%s%s%s%s%s%s%s%s", r->type == FT_STRAT ? r->opt->used_by : "",
             r->type == FT_STRAT ? ": " : "", r->help, def ? " (default " : "", def ? def : "",
             def ? ")" : "", r->env ? "; env $" : "", r->env ? r->env : "",
             r->alias ? "; also " : "", r->alias ? r->alias : "");
    if (r->type == FT_ENUM && strlen(buf) + strlen(r->choices) + 4 < len)
        snprintf(buf + strlen(buf), len - strlen(buf), " [%s]", r->choices);
}

void flags_help(FILE *out, int sub) {
    // the help written whole at the end (cli_finish_stdout): in 4 KiB pieces a piece that fails
    // mid-text keeps no errno, and the final flush could only say that an earlier write failed.
    // Help is the first output of its process, so the stream may still take a buffer.
    static char whole[1 << 16];   // (glibc takes a size only with a buffer)
    if (out == stdout) setvbuf(stdout, whole, _IOFBF, sizeof whole);
    rows_init();
    int k = sub_index(sub);
    fprintf(out, "usage: %s\n\n", SUBS[k].usage);
    if (sub == R) fprintf(out, "sift %s\n", SIFT_VERSION);
    for (int i = 1; sub == R && i < FLAG_N_SUBS; i++)   // the subcommands
        fprintf(out, "%s %s\n", i == 1 ? "subcommands (each: sift SUB --help):\n " : " ", SUBS[i].usage);
    if (sub == R) fputc('\n', out);
    int col = 0;   // the prose, wrapped at 96 columns
    for (const char *w = SUBS[k].about; *w;) {
        int len = (int)strcspn(w, " ");
        if (col && col + 1 + len > 96) fputc('\n', out), col = 0;
        col += fprintf(out, "%s%.*s", col ? " " : "", len, w);
        w += len;
        while (*w == ' ') w++;
    }
    fputc('\n', out);
    const char *section = NULL;
    for (int i = 0; i < N_ROWS; i++) {
        const flag_row *r = &ROWS[i];
        if (r->section) section = r->section;
        if (!(r->subs & sub)) continue;
        if (section) fprintf(out, "\n%s\n", section), section = NULL;
        char head[80], text[900];
        row_head(r, sub, head, sizeof head);
        row_text(r, sub, text, sizeof text);
        cli_help_line(out, 2, head, text);
    }
    fprintf(out, "\nexamples\n");
    for (const char *e = SUBS[k].examples; *e; e += strcspn(e, "\n") + 1)
        fprintf(out, "  %.*s\n", (int)strcspn(e, "\n"), e);
    if (sub & (R | B | E | W)) fprintf(out, "\nstrategies: %s\n", strategy_names());
    if (sub & (E | W)) fprintf(out, "tasks: %s\n", eval_task_names());
    if (sub == B) fprintf(out, "synthetic models: %s\n", synth_names());
    fprintf(out, "\nflags llama.cpp users may type: ");
    for (size_t i = 0; i < sizeof LLAMA / sizeof *LLAMA; i++)
        fprintf(out, "%s%.*s", i ? ", " : "", (int)strcspn(LLAMA[i].names, "|"), LLAMA[i].names);
    fprintf(out, " are refused with what to use instead\n");
}

// The names a row answers to in sub, into names (up to 3).
static int row_names(const flag_row *r, int sub, const char **names) {
    int n = 0;
    if (r->s && (!r->short_subs || (r->short_subs & sub))) names[n++] = r->s;
    names[n++] = r->l;
    if (r->alias) names[n++] = r->alias;
    return n;
}

// sift --list-flags: "SUB<TAB>NAME<TAB>TYPE<TAB>LIST" per name a subcommand takes (run as "run").
static void list_flags(void) {
    static const char *const TYPES[] = {"switch", "string", "path", "int", "float", "enum", "names",
                                        "strategy"};
    for (int k = 0; k < FLAG_N_SUBS; k++)
        for (int i = 0; i < N_ROWS; i++) {
            const flag_row *r = &ROWS[i];
            const char *names[3];
            if (!(r->subs & SUBS[k].sub)) continue;
            int n = row_names(r, SUBS[k].sub, names);
            for (int j = 0; j < n; j++)
                printf("%s\t%s\t%s\t%s\n", sub_word(SUBS[k].sub), names[j], TYPES[r->type],
                       r->list_subs & SUBS[k].sub ? "list" : r->type == FT_ENUM ? r->choices : "-");
        }
}

static void md_cell(const char *s) {
    for (; *s; s++) {
        if (*s == '|') putchar('\\');
        putchar(*s);
    }
}

// sift --help-markdown: docs/usage.md's flag table and the llama.cpp correspondences.
static void help_markdown(void) {
    printf("| flag | run | bench | eval | sweep | ppl | fit-phi | default | meaning |\n"
           "|---|:-:|:-:|:-:|:-:|:-:|:-:|---|---|\n");
    for (int i = 0; i < N_ROWS; i++) {
        const flag_row *r = &ROWS[i];
        printf("| `");
        if (r->s) printf("%s%s, ", r->s, r->short_subs ? " (bench)" : "");
        md_cell(r->l);
        if (r->metavar) printf(" "), md_cell(r->metavar);
        printf("`");
        if (r->alias) printf(" (also `%s`)", r->alias);
        printf(" |");
        for (int k = 0; k < FLAG_N_SUBS; k++)
            printf(" %s |", !(r->subs & SUBS[k].sub) ? "" : r->list_subs & SUBS[k].sub ? "list" : "✓");
        printf(" ");
        if (r->def) {
            char d[64];
            md_cell(row_default(r, r->subs & R ? R : SUBS[__builtin_ctz(r->subs)].sub, d, sizeof d) ? d : "");
            for (const char *p = strchr(r->def, '|'); p; p = strchr(p + 1, '|'))
                printf("; %.*s", (int)strcspn(p + 1, "|"), p + 1);
        } else if (r->env) printf("$%s", r->env);
        printf(" | ");
        if (r->type == FT_STRAT) md_cell(r->opt->used_by), printf(": ");
        md_cell(r->help);
        if (r->type == FT_ENUM) printf(" ("), md_cell(r->choices), printf(")");
        printf(" |\n");
    }
    printf("\n| llama.cpp | sift |\n|---|---|\n");
    for (int i = 0; i < N_ROWS; i++)
        if (ROWS[i].alias && ROWS[i].alias[1] == '-' && strcmp(ROWS[i].alias, "--n-gen") &&
            strcmp(ROWS[i].alias, "--repetitions"))
            printf("| `%s` | `%s` |\n", ROWS[i].alias, ROWS[i].l);
    printf("| `-p N` (llama-bench), `-n N`, `-r N`, `-o md` | `sift bench -p N`, `-n N`, `-r N`, "
           "`--format md` |\n| `--chunks N` (llama-perplexity) | `sift ppl --chunks N` |\n");
    for (size_t i = 0; i < sizeof LLAMA / sizeof *LLAMA; i++) {
        printf("| `");
        for (const char *p = LLAMA[i].names; *p; p++) fputs(*p == '|' ? "`, `" : (char[2]){*p, 0}, stdout);
        printf("` | refused: %s |\n", LLAMA[i].instead);
    }
}

// ---- completions ----

// The values completion offers after r (space-separated) into buf: an enumerated flag's choices,
// the strategies (and all) for --strategy, the tasks (and all) for --tasks, a strategy parameter's
// choices; "" for none (then a path completes files, anything else nothing).
static const char *row_values(const flag_row *r, char *buf, size_t len) {
    const char *v = r->type == FT_ENUM                                   ? r->choices
                  : r->id == FL_STRATEGY                                 ? strategy_names()
                  : r->id == FL_TASKS                                    ? eval_task_names()
                  : r->type == FT_STRAT && r->opt->type == OPT_CHOICE    ? r->metavar
                                                                         : "";
    int j = snprintf(buf, len, "%s", r->type == FT_NAMES ? "all " : "");
    for (; *v && j + 1 < (int)len; v++)
        if (*v == '|' || *v == ',') buf[j++] = ' ';
        else if (*v != ' ' || (j && buf[j - 1] != ' ')) buf[j++] = *v;
    buf[j] = 0;
    return buf;
}

static int row_is_path(const flag_row *r) {
    return r->type == FT_PATH || (r->type == FT_STRAT && r->opt->type == OPT_PATH);
}

// A description for zsh and fish: r's help up to max characters, cut at a word boundary with an
// ellipsis (never mid-word), into buf.
static const char *short_help(const flag_row *r, int max, char *buf, size_t len) {
    snprintf(buf, len, "%s", r->help);
    if ((int)strlen(buf) <= max) return buf;
    int cut = max;
    while (cut > 0 && buf[cut] != ' ') cut--;
    while (cut > 0 && strchr(" ,;:(|", buf[cut - 1])) cut--;   // no dangling punctuation
    snprintf(buf + cut, len - (size_t)cut, "…");
    return buf;
}

// s inside a shell single-quoted word: ' as '\''; for zsh's _arguments also \ [ ] : escaped with a
// backslash (esc: those characters).
static void sq_text(const char *s, const char *esc) {
    for (; *s; s++) {
        if (*s == '\'') fputs("'\\''", stdout);
        else {
            if (strchr(esc, *s)) putchar('\\');
            putchar(*s);
        }
    }
}

static void bash_completion(void) {
    printf("# bash completion for sift (sift --completion bash)\n"
           "_sift_list() {   # a comma list: the name after the last comma\n"
           "    local pre=\n    [[ $cur == *,* ]] && pre=${cur%%,*},\n"
           "    COMPREPLY=($(compgen -P \"$pre\" -W \"$1\" -- \"${cur##*,}\"))\n}\n"
           "_sift() {\n"
           "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} sub=run opts\n"
           "    # --flag=VALUE: readline makes '=' a word of its own\n"
           "    if [[ $cur == = ]]; then cur=; elif [[ $prev == = ]]; then prev=${COMP_WORDS[COMP_CWORD-2]}; fi\n"
           "    case ${COMP_WORDS[1]} in bench|eval|sweep|ppl|fit-phi) sub=${COMP_WORDS[1]};; esac\n"
           "    if [ \"$COMP_CWORD\" = 1 ] && [[ $cur != -* ]]; then\n"
           "        COMPREPLY=($(compgen -W \"bench eval sweep ppl fit-phi help\" -- \"$cur\")); return; fi\n"
           "    if [ \"$COMP_CWORD\" = 2 ] && [ \"${COMP_WORDS[1]}\" = help ]; then\n"
           "        COMPREPLY=($(compgen -W \"run bench eval sweep ppl fit-phi\" -- \"$cur\")); return; fi\n"
           "    case $prev in\n");
    for (int i = 0; i < N_ROWS; i++) {
        const flag_row *r = &ROWS[i];
        char vals[400];
        row_values(r, vals, sizeof vals);
        if (!vals[0] && !row_is_path(r)) continue;
        printf("        %s%s%s%s%s) ", r->s ? r->s : "", r->s ? "|" : "", r->l, r->alias ? "|" : "",
               r->alias ? r->alias : "");
        if (!vals[0]) printf("COMPREPLY=($(compgen -f -- \"$cur\")); return;;\n");
        else if (r->type == FT_NAMES) printf("_sift_list \"%s\"; return;;\n", vals);
        else printf("COMPREPLY=($(compgen -W \"%s\" -- \"$cur\")); return;;\n", vals);
    }
    printf("    esac\n    case $sub in\n");
    for (int k = 0; k < FLAG_N_SUBS; k++) {
        printf("        %s) opts=\"", sub_word(SUBS[k].sub));
        int first = 1;
        for (int i = 0; i < N_ROWS; i++) {
            const char *names[3];
            if (!(ROWS[i].subs & SUBS[k].sub)) continue;
            int n = row_names(&ROWS[i], SUBS[k].sub, names);
            for (int j = 0; j < n; j++) printf("%s%s", first ? "" : " ", names[j]), first = 0;
        }
        printf("\";;\n");
    }
    printf("    esac\n    COMPREPLY=($(compgen -W \"$opts\" -- \"$cur\"))\n}\n"
           "complete -o default -F _sift sift\n");
}

static void zsh_completion(void) {
    printf("#compdef sift\n# zsh completion for sift (sift --completion zsh)\n_sift() {\n"
           "    local sub=run\n"
           "    if (( CURRENT == 2 )) && [[ $words[2] != -* ]]; then\n"
           "        _values subcommand bench eval sweep ppl fit-phi help; return; fi\n"
           "    if [[ $words[2] == help ]]; then\n"
           "        (( CURRENT == 3 )) && _values subcommand run bench eval sweep ppl fit-phi; return; fi\n"
           "    case $words[2] in bench|eval|sweep|ppl|fit-phi) sub=$words[2]; shift words; (( CURRENT-- ));; esac\n"
           "    case $sub in\n");
    for (int k = 0; k < FLAG_N_SUBS; k++) {
        printf("    %s)\n        _arguments", sub_word(SUBS[k].sub));
        for (int i = 0; i < N_ROWS; i++) {
            const flag_row *r = &ROWS[i];
            const char *names[3];
            if (!(r->subs & SUBS[k].sub)) continue;
            int n = row_names(r, SUBS[k].sub, names);
            char help[200], vals[400];
            short_help(r, 80, help, sizeof help);
            row_values(r, vals, sizeof vals);
            for (int j = 0; j < n; j++) {
                int many = r->id == FL_VERBOSE || r->id == FL_FILE || r->id == FL_STOP;
                printf(" \\\n            '%s%s%s[", many ? "*" : "", names[j],
                       r->type != FT_SWITCH && names[j][1] == '-' ? "=" : "");
                sq_text(help, "\\[]:");
                printf("]");
                if (r->type == FT_SWITCH) {
                } else if (r->type == FT_NAMES) printf(":%s: _sequence compadd - %s", r->metavar, vals);
                else if (vals[0]) printf(":%s:(%s)", r->metavar, vals);
                else if (row_is_path(r)) printf(":%s:_files", r->metavar);
                else printf(":%s: ", r->metavar);
                printf("'");
            }
        }
        printf(";;\n");
    }
    printf("    esac\n}\n_sift \"$@\"\n");
}

static void fish_completion(void) {
    printf("# fish completion for sift (sift --completion fish)\n"
           "function __sift_sub --description 'the sift subcommand being completed (run: none)'\n"
           "    set -l words (commandline -opc)\n"
           "    if set -q words[2]; and contains -- $words[2] bench eval sweep ppl fit-phi\n"
           "        echo $words[2]\n    else\n        echo run\n    end\nend\n"
           "complete -c sift -f\n"
           "complete -c sift -n 'test (count (commandline -opc)) -eq 1' -a 'bench eval sweep ppl "
           "fit-phi help' -d subcommand\n"
           "complete -c sift -n 'test (count (commandline -opc)) -eq 2; and contains -- help "
           "(commandline -opc)' -a 'run bench eval sweep ppl fit-phi' -d subcommand\n");
    for (int k = 0; k < FLAG_N_SUBS; k++)
        for (int i = 0; i < N_ROWS; i++) {
            const flag_row *r = &ROWS[i];
            const char *names[3];
            if (!(r->subs & SUBS[k].sub)) continue;
            int n = row_names(r, SUBS[k].sub, names);
            char help[200], vals[400];
            printf("complete -c sift -n 'test (__sift_sub) = %s'", sub_word(SUBS[k].sub));
            for (int j = 0; j < n; j++)   // -s x, -o ctk (one dash, several letters), -l name
                printf(" -%c %s", names[j][1] == '-' ? 'l' : names[j][2] ? 'o' : 's',
                       names[j] + (names[j][1] == '-' ? 2 : 1));
            printf(" -d '");
            sq_text(short_help(r, 80, help, sizeof help), "\\");
            printf("'");
            row_values(r, vals, sizeof vals);
            if (vals[0]) printf(" -x -a '%s'", vals);
            else if (row_is_path(r)) printf(" -r -F");
            else if (r->type != FT_SWITCH) printf(" -x");
            printf("\n");
        }
}

static void completion_script(const char *shell) {
    if (strcmp(shell, "bash") == 0) bash_completion();
    else if (strcmp(shell, "zsh") == 0) zsh_completion();
    else fish_completion();
}

// ---- the man page ----

static void roff(const char *s) {
    for (; *s; s++) {
        if (*s == '-' || *s == '\\') putchar('\\');
        putchar(*s);
    }
}

// sift --man: a man page (section 1) from the table, one section per subcommand, then the exit
// status, the environment (the table's env column), files and every subcommand's examples.
static void man_page(void) {
    printf(".TH SIFT 1 \"\" \"sift %s\" \"User Commands\"\n.SH NAME\nsift \\- run and measure "
           "long\\-context strategies on Llama\\-family models\n.SH SYNOPSIS\n", SIFT_VERSION);
    for (int k = 0; k < FLAG_N_SUBS; k++) printf(".B "), roff(SUBS[k].usage), printf("\n.br\n");
    printf(".B sift help\n.RI [ SUBCOMMAND ]\n");
    for (int k = 0; k < FLAG_N_SUBS; k++) {
        printf(".SH \"%s\"\n", k ? SUBS[k].name : "SIFT (RUN)");
        roff(SUBS[k].about), printf("\n");
        for (int i = 0; i < N_ROWS; i++) {
            const flag_row *r = &ROWS[i];
            if (!(r->subs & SUBS[k].sub)) continue;
            const char *names[3];
            char text[900];
            int n = row_names(r, SUBS[k].sub, names);
            printf(".TP\n");
            for (int j = 0; j < n; j++) printf("%s\\fB", j ? ", " : ""), roff(names[j]), printf("\\fR");
            if (r->metavar) printf(" \\fI"), roff(r->metavar), printf("\\fR");
            printf("\n");
            row_text(r, SUBS[k].sub, text, sizeof text);
            roff(text), printf("\n");
        }
    }
    printf(".PP\nA flag's value follows it (\\fB\\-\\-top\\-p 0.9\\fR) or, for the \\-\\-long names, "
           "an = (\\fB\\-\\-top\\-p=0.9\\fR).\n"
           ".SH EXIT STATUS\n.TP\n0\nsuccess\n.TP\n1\na run failed: a request or prompt that could "
           "not be run, a model that cannot load, an output that could not be written\n.TP\n2\n"
           "a usage error (one line on stderr naming the subcommand's \\-\\-help): an unknown flag "
           "or value, a value out of range or too small for the task, flags that exclude each "
           "other, a missing input file or output directory\n.TP\n130, 143\ninterrupted by SIGINT "
           "or SIGTERM (128 + the signal's number)\n.SH ENVIRONMENT\n");
    for (int i = 0; i < N_ROWS; i++)
        if (ROWS[i].env) {
            printf(".TP\n.B "), roff(ROWS[i].env), printf("\nthe default of "), roff(ROWS[i].l);
            printf(" ("), roff(ROWS[i].s ? ROWS[i].s : ROWS[i].l), printf("): "), roff(ROWS[i].help);
            printf("\n");
        }
    printf(".TP\n.B SIFT_PARSE_ONLY\n1: check the command line and exit 0 without loading a model "
           "or opening its files\n.SH FILES\n.TP\n.I ");
    roff(DEFAULT_MODEL);
    printf("\nbeside the sift binary: the model when neither \\-m nor $SIFT_MODEL names one\n.TP\n"
           ".I FILE.lock\nbeside \\fBsift \\-o\\fR \\fIFILE\\fR: the pid of the sift writing FILE\n"
           ".TP\n.I FILE.progress\nbeside \\fBsift fit\\-phi \\-o\\fR \\fIFILE\\fR: the fit's "
           "progress, for a rerun to resume\n.SH EXAMPLES\n");
    for (int k = 0; k < FLAG_N_SUBS; k++) {
        printf(".PP\n.nf\n");
        for (const char *e = SUBS[k].examples; *e; e += strcspn(e, "\n") + 1) {
            char line[400];
            snprintf(line, sizeof line, "%.*s", (int)strcspn(e, "\n"), e);
            roff(line), printf("\n");
        }
        printf(".fi\n");
    }
}

// The top-level outputs of the table; 1 when a was one (printed). eq: the value of a=VALUE, next:
// the argument after a.
static int top_output(const char *a, const char *eq, const char *next) {
    int completion = strcmp(a, "--completion") == 0;
    if (!completion && strcmp(a, "--help-markdown") && strcmp(a, "--list-flags") && strcmp(a, "--man"))
        return 0;
    if (eq && !completion) cli_usage_error("%s takes no value (got '%s=%s')", a, a, eq);
    const char *v = eq ? eq : next;
    if (completion && (!v || (strcmp(v, "bash") && strcmp(v, "zsh") && strcmp(v, "fish"))))
        cli_usage_error("--completion needs bash, zsh or fish");
    if (completion) completion_script(v);
    else if (strcmp(a, "--help-markdown") == 0) help_markdown();
    else if (strcmp(a, "--list-flags") == 0) list_flags();
    else man_page();
    return 1;
}

#undef R
#undef B
#undef E
#undef W
#undef P
#undef F
