/* kmirrord: the daemon's entry point; it only wires the modules together. */
#include <stdio.h>
#include <string.h>

#include "kmirror/version.h"

static void usage(FILE *out)
{
	fprintf(out, "usage: kmirrord [--version] [--help]\n"
		     "Kafka-protocol proxy that fronts a destination cluster and mirrors topics into it.\n");
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--version") == 0) {
			printf("kmirrord %s\n", KM_VERSION);
			return 0;
		}
		if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
			usage(stdout);
			return 0;
		}
		fprintf(stderr, "kmirrord: unknown option '%s' (try --help)\n", argv[i]);
		return 2;
	}
	usage(stderr);
	return 2;
}
