// main.c — the sift command line: the developer tunables read once, then the subcommand its first
// word names (cmd/: bench, eval, sweep, ppl, fit-phi, and help), else prompts run (cmd/run.c).
// Never interactive. Exit codes (docs/usage.md's table): 0 ok, 1 a request, the model or a write failed,
// 2 bad usage, 128 + the signal's number when interrupted.
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cmd/cmd.h"
#include "cmd/flags.h"
#include "util/tunables.h"

static const struct { const char *name; int (*run)(int argc, char **argv); } SUBCOMMANDS[] = {
    {"bench", cmd_bench}, {"eval", cmd_eval}, {"sweep", cmd_sweep}, {"ppl", cmd_ppl}, {"fit-phi", cmd_fit_phi}};

// Every command ends with stdout checked (cli_finish_stdout): text lost to a full disk is an
// error, not exit 0.
int main(int argc, char **argv) {
    backend_cpu_blas_init(argv);
    char terr[256];   // the developer tunables (util/tunables.h), read once before anything runs
    if (tunables_load(terr, sizeof terr)) {
        fprintf(stderr, "sift: error: %s\n", terr);
        return 2;
    }
    if (argc > 1 && strcmp(argv[1], "help") == 0) flags_help_command(argc, argv);
    int (*run)(int, char **) = cmd_run;   // no subcommand's word: the prompts run
    for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof *SUBCOMMANDS; i++)
        if (argc > 1 && strcmp(argv[1], SUBCOMMANDS[i].name) == 0) run = SUBCOMMANDS[i].run;
    return cli_finish_stdout(run(argc, argv));
}
