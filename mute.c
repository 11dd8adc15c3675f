#include "common.h"
int main(void)
{
	chime_t *c;
	uint64_t t0 = chime_now();
	int r = chime_open(&c, &(struct chime_opts){ .socket_path = "/tmp/adopt/mute.sock" });
	printf("chime_open against a mute broker: %d (%s) after %.1f s\n", r, strerror(-r), (chime_now() - t0) / 1e9);
	return 0;
}
