// tok/stb_ds.c — the one compilation unit that holds the stb_ds implementation (dynamic arrays
// and hash maps from <stb/stb_ds.h>) for the whole program; every other file only includes it.
#define STB_DS_IMPLEMENTATION
#include <stb/stb_ds.h>
