/* SPDX-License-Identifier: MIT */
/*
 * cliarg.h - the rule every whole-number option of chimed and the tools
 * starts from, so that they all take and refuse the same text. Each
 * option's own range (and any sign or list it allows) is checked on top.
 */
#ifndef CHIME_CLIARG_H
#define CHIME_CLIARG_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * A whole decimal number in s[0..len): digits only (no sign, no space,
 * no "0x", nothing after them), at most UINT64_MAX. strtoull() would take
 * " 5" and "+5" and wrap "-1". 0 (*out set), -EINVAL (not such a number,
 * "" included), -ERANGE (digits only, but more than UINT64_MAX).
 */
static inline int chime_parse_u64n(const char *s, size_t len, uint64_t *out)
{
	uint64_t v = 0;
	int over = 0;

	if (!len)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		unsigned d = (unsigned char)s[i] - '0';

		if (d > 9)
			return -EINVAL;
		if (v > (UINT64_MAX - d) / 10)
			over = 1;       /* read on: "99...9x" is not a number at all */
		else
			v = v * 10 + d;
	}
	if (over)
		return -ERANGE;
	*out = v;
	return 0;
}

/* chime_parse_u64n() of the whole string. */
static inline int chime_parse_u64(const char *s, uint64_t *out)
{
	return chime_parse_u64n(s, strlen(s), out);
}

#endif /* CHIME_CLIARG_H */
