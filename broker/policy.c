/* SPDX-License-Identifier: MIT */
/* policy.c - who may connect. See policy.h. */
#include "policy.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_IDS 4096            /* per list: a policy, not a user database */
#define MAX_SUBUID_RANGES 1048576u
#define NSS_BUF 16384

/* A number, or a name looked up by `kind` ('u' users, 'g' groups). */
static int resolve(char kind, const char *tok, unsigned *id, char *err, size_t errlen)
{
	char buf[NSS_BUF], *end;
	unsigned long v;
	int r;

	if (isdigit((unsigned char)tok[0])) {
		errno = 0;
		v = strtoul(tok, &end, 10);
		if (errno || *end || v >= UINT_MAX) {
			snprintf(err, errlen, "'%.200s' is not a valid %s id", tok, kind == 'u' ? "user" : "group");
			return -EINVAL;
		}
		*id = (unsigned)v;
		return 0;
	}
	if (kind == 'u') {
		struct passwd pw, *res = NULL;

		r = getpwnam_r(tok, &pw, buf, sizeof(buf), &res);
		if (!r && res) {
			*id = (unsigned)pw.pw_uid;
			return 0;
		}
	} else {
		struct group gr, *res = NULL;

		r = getgrnam_r(tok, &gr, buf, sizeof(buf), &res);
		if (!r && res) {
			*id = (unsigned)gr.gr_gid;
			return 0;
		}
	}
	snprintf(err, errlen, "no %s named '%.200s'%s%s", kind == 'u' ? "user" : "group", tok,
		 r ? ": " : "", r ? strerror(r) : "");
	/* the lookup's own want of descriptors or memory: not an answer about the name */
	return r == EMFILE || r == ENFILE || r == ENOMEM ? -r : -EINVAL;
}

/* One entry of a list: its id appended to *out. */
static int add_id(char kind, const char *tok, unsigned **out, size_t *n, char *err, size_t errlen)
{
	unsigned id, *grown;
	int r = resolve(kind, tok, &id, err, errlen);

	if (r < 0)
		return r;
	if (*n >= MAX_IDS) {
		snprintf(err, errlen, "more than %d entries", MAX_IDS);
		return -EINVAL;
	}
	grown = realloc(*out, (*n + 1) * sizeof(**out));
	if (!grown) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	*out = grown;
	(*out)[(*n)++] = id;
	return 0;
}

/* "a,b, c" -> ids, appended to *out. */
static int parse_list(char kind, const char *list, unsigned **out, size_t *n, char *err, size_t errlen)
{
	char *copy = strdup(list), *rest = copy, *part, *save, *tok;
	int r = 0;

	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* "--allow-uid ''", "," or a bare "allow-uid" line admits nobody more: a mistake, not a policy. */
	if (list[strspn(list, ", \t")] == '\0') {
		snprintf(err, errlen, "an empty list (%s names or numbers, separated by commas)",
			 kind == 'u' ? "user" : "group");
		free(copy);
		return -EINVAL;
	}
	/*
	 * One comma at the end is what a template's loop writes ("{{u}},"),
	 * and brokers before the empty-entry rule took it: refused, a
	 * `chimectl restart` onto this version left no broker. Dropped.
	 */
	for (size_t len = strlen(copy); len > 0; len--) {
		if (copy[len - 1] == ',') {
			copy[len - 1] = '\0';
			break;
		}
		if (copy[len - 1] != ' ' && copy[len - 1] != '\t')
			break;
	}
	while (r == 0 && (part = strsep(&rest, ",")) != NULL) {
		tok = strtok_r(part, " \t", &save);
		/* "a,,b", ",a" or "a,,": no one where an entry was meant, the mark of an empty variable in a generated list */
		if (!tok) {
			snprintf(err, errlen, "an empty entry in '%.64s' (two commas in a row, or one at the start)", list);
			r = -EINVAL;
		}
		for (; tok && r == 0; tok = strtok_r(NULL, " \t", &save))
			r = add_id(kind, tok, out, n, err, errlen);
	}
	free(copy);
	return r;
}

_Static_assert(sizeof(uid_t) == sizeof(unsigned) && sizeof(gid_t) == sizeof(unsigned), "ids are unsigned");

int policy_parse_uids(const char *list, uid_t **out, size_t *n, char *err, size_t errlen)
{
	return parse_list('u', list, (unsigned **)out, n, err, errlen);
}

int policy_parse_gids(const char *list, gid_t **out, size_t *n, char *err, size_t errlen)
{
	return parse_list('g', list, (unsigned **)out, n, err, errlen);
}

int policy_group(const char *name, gid_t *gid, char *err, size_t errlen)
{
	unsigned id;
	int r = resolve('g', name, &id, err, errlen);

	if (r == 0)
		*gid = (gid_t)id;
	return r;
}

/* "NAME USER" or "NAME* USER" of a session line. */
static int session_line(struct policy *p, char *val, char *err, size_t errlen)
{
	char *save = NULL, *name = strtok_r(val, " \t", &save), *user = strtok_r(NULL, " \t", &save);
	char *extra = strtok_r(NULL, " \t", &save);
	struct session_rule r = { 0 }, *grown;
	size_t len;
	unsigned uid;
	int rc;

	if (!name || !user || extra) {
		snprintf(err, errlen, "session: expected 'session NAME USER' (NAME may end in '*')");
		return -EINVAL;
	}
	len = strlen(name);
	r.prefix = len > 1 && name[len - 1] == '*';
	len -= r.prefix;
	if (len < sizeof(r.name))
		memcpy(r.name, name, len);
	if (len == 0 || len >= sizeof(r.name) || chime_session_len(r.name) != (int)len) {
		snprintf(err, errlen, "session: '%.64s' is not a session name (1-%u of [A-Za-z0-9._-], "
			 "'*' last for a prefix)", name, CHIME_SESSION_MAX - 1);
		return -EINVAL;
	}
	if ((rc = resolve('u', user, &uid, err, errlen)) < 0)
		return rc;
	r.uid = (uid_t)uid;
	grown = realloc(p->sessions, (p->nr_sessions + 1) * sizeof(*grown));
	if (!grown) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->sessions = grown;
	p->sessions[p->nr_sessions++] = r;
	return 0;
}

/*
 * One line of a policy file: "allow-uid LIST", "allow-gid LIST", "allow-all",
 * "session NAME USER", "#..." or blank.
 */
static int file_line(struct policy *p, char *line, char *err, size_t errlen)
{
	char *key = line, *val, *end = line + strlen(line);

	/* a file saved with CRLF line ends: the \r is white space, not part of the last word */
	while (end > line && isspace((unsigned char)end[-1]))
		*--end = '\0';
	while (isspace((unsigned char)*key))
		key++;
	if (!*key || *key == '#')
		return 0;
	val = key + strcspn(key, " \t");
	if (*val)
		*val++ = '\0';
	val[strcspn(val, "#")] = '\0';
	if (!strcmp(key, "allow-all")) {
		/* "allow-all no" must not admit everyone: the keyword takes nothing. */
		val += strspn(val, " \t");
		if (*val) {
			snprintf(err, errlen, "allow-all: takes no value (got '%.64s'); remove the line to admit "
				 "only the users listed", val);
			return -EINVAL;
		}
		p->allow_all = true;
		return 0;
	}
	if (!strcmp(key, "allow-uid"))
		return policy_parse_uids(val, &p->uids, &p->nr_uids, err, errlen);
	if (!strcmp(key, "allow-gid"))
		return policy_parse_gids(val, &p->gids, &p->nr_gids, err, errlen);
	if (!strcmp(key, "session"))
		return session_line(p, val, err, errlen);
	snprintf(err, errlen, "unknown setting '%.64s' (allow-uid, allow-gid, allow-all, session)", key);
	return -EINVAL;
}

#define LINE_MAX_BYTES 65536u   /* a policy or subuid line: some 9000 uids in a list */

/*
 * One line of f into buf (without its newline), at most size - 1 bytes:
 * 1, 0 at the end, -1 on a read error. A longer line is never taken as two
 * (a fixed-size fgets() read the tail of a long comment as a setting of
 * its own): *over is set and reading stops there, the rest unread, so that
 * a file with no newline (/dev/zero) costs a buffer, not all memory.
 * *nul: it held a NUL byte.
 */
static int read_line(FILE *f, char *buf, size_t size, bool *over, bool *nul)
{
	size_t n = 0;
	int ch = EOF;

	*over = *nul = false;
	while (n + 1 < size && (ch = getc(f)) != EOF && ch != '\n') {
		*nul |= ch == '\0';
		buf[n++] = (char)ch;
	}
	buf[n] = '\0';
	if (n + 1 >= size) {
		/* full: over unless the newline (or the end) comes next */
		ch = getc(f);
		*over = ch != '\n' && ch != EOF;
	}
	if (ferror(f))
		return -1;
	return ch == EOF && !n ? 0 : 1;
}

/*
 * path opened for reading, as a stream. The control thread reads these files
 * at a SIGHUP: nothing here may wait. O_NONBLOCK: a FIFO's open would wait
 * for a writer, for good (the heartbeat, every handshake and the stop with
 * it); it is refused (-ENODEV, *fifo set), not read as the empty text a FIFO
 * without a writer gives. A device that would wait in read() gives -EAGAIN
 * there instead (/dev/null and /dev/zero read as before). O_NOCTTY: a
 * terminal is not made chimed's.
 */
static FILE *open_text(const char *path, bool *fifo)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	struct stat st;
	FILE *f;

	*fifo = false;
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || (*fifo = S_ISFIFO(st.st_mode))) {
		int e = *fifo ? ENODEV : errno;

		close(fd);
		errno = e;
		return NULL;
	}
	f = fdopen(fd, "r");
	if (!f)
		close(fd);
	return f;
}

static int load_file(struct policy *p, const char *path, char *err, size_t errlen)
{
	bool fifo;
	FILE *f = open_text(path, &fifo);
	char *line, msg[256];
	unsigned no = 0;
	bool over, nul;
	int r = 0, got;

	if (!f) {
		r = -errno;
		if (fifo)
			snprintf(err, errlen, "policy file '%.200s' is a FIFO, not a file", path);
		else
			snprintf(err, errlen, "cannot open policy file '%.200s': %s", path, strerror(-r));
		return r;
	}
	line = malloc(LINE_MAX_BYTES);
	if (!line) {
		fclose(f);
		snprintf(err, errlen, "policy file '%.200s': out of memory", path);
		return -ENOMEM;
	}
	errno = 0;
	while (r == 0 && (got = read_line(f, line, LINE_MAX_BYTES, &over, &nul)) > 0) {
		no++;
		if (over || nul) {
			snprintf(err, errlen, "%s:%u: %s", path, no, nul ? "a NUL byte: not a text file" :
				 "longer than 65535 bytes (split a long list over several lines)");
			r = -EINVAL;
			break;
		}
		msg[0] = '\0';
		/* a UTF-8 byte order mark first (Windows editors, as CRLF): no part of the first word, and unseen in its message */
		r = file_line(p, line + (no == 1 && !strncmp(line, "\xef\xbb\xbf", 3) ? 3 : 0), msg, sizeof(msg));
		if (r < 0)
			snprintf(err, errlen, "%s:%u: %s", path, no, msg);
	}
	/* A directory opens, and reading it then fails (EISDIR): not an empty policy. */
	if (r == 0 && ferror(f)) {
		r = errno ? -errno : -EIO;
		snprintf(err, errlen, "cannot read policy file '%.200s': %s", path, strerror(-r));
	}
	free(line);
	fclose(f);
	return r;
}

/* ---- subordinate uids (subuid(5)) ---- */

struct subuid_line {
	char *owner;                    /* as written: a name or a number */
	struct uid_range r;
	uid_t uid;                      /* the owner's uid, if `known` (owners_resolve()) */
	bool known;
};

static int by_owner(const void *pa, const void *pb)
{
	const struct subuid_line *a = pa, *b = pb;
	int c = strcmp(a->owner, b->owner);

	return c ? c : a->r.start < b->r.start ? -1 : a->r.start > b->r.start;
}

static int by_uid(const void *pa, const void *pb)
{
	uid_t a = *(const uid_t *)pa, b = *(const uid_t *)pb;

	return a < b ? -1 : a > b;
}

/*
 * By account: the ranges of one uid together, whatever names it (its name,
 * its number, another name of the same uid: newuidmap(1) gives it all of
 * them), then those of a name no user has, by name; each by start.
 */
static int by_account(const void *pa, const void *pb)
{
	const struct subuid_line *a = pa, *b = pb;
	int c;

	if (a->known != b->known)
		return a->known ? -1 : 1;
	c = a->known ? (a->uid < b->uid ? -1 : a->uid > b->uid) : strcmp(a->owner, b->owner);
	return c ? c : a->r.start < b->r.start ? -1 : a->r.start > b->r.start;
}

static bool same_account(const struct subuid_line *a, const struct subuid_line *b)
{
	return a->known == b->known && (a->known ? a->uid == b->uid : !strcmp(a->owner, b->owner));
}

static int by_start(const void *pa, const void *pb)
{
	const struct uid_range *a = pa, *b = pb;

	return a->start < b->start ? -1 : a->start > b->start;
}

/* "owner:start:count" into *l; false if it is not one. */
static bool subuid_parse(char *line, struct subuid_line *l)
{
	char *owner = line, *start, *count, *end;
	unsigned long long s, n;

	start = strchr(owner, ':');
	if (!start || start == owner)
		return false;
	*start++ = '\0';
	count = strchr(start, ':');
	if (!count)
		return false;
	*count++ = '\0';
	count[strcspn(count, " \t\r")] = '\0';
	if (!isdigit((unsigned char)*start) || !isdigit((unsigned char)*count))
		return false;
	errno = 0;
	s = strtoull(start, &end, 10);
	if (errno || *end)
		return false;
	n = strtoull(count, &end, 10);
	if (errno || *end || n == 0 || s >= UINT32_MAX || n > UINT32_MAX - s)
		return false;
	l->owner = strdup(owner);
	l->r = (struct uid_range){ .start = (uid_t)s, .count = (uint32_t)n };
	return l->owner != NULL;
}

static int by_name(const void *key, const void *elt)
{
	return strcmp(key, *(char *const *)elt);
}

/*
 * The owners' uids into p->subuid_owners, sorted: a name no user has owns
 * nothing. One pass over the user database, then a lookup each for the
 * names it did not list (numbers, and directories that do not enumerate):
 * a lookup each alone reads /etc/passwd once per owner, seconds of the
 * control thread's time on a host of ten thousand users. l is sorted by
 * owner.
 */
static int owners_resolve(struct policy *p, struct subuid_line *l, size_t n)
{
	const char **names = malloc(n * sizeof(*names));
	bool *found = calloc(n, sizeof(*found));
	uid_t *uids = malloc(n * sizeof(*uids));
	struct passwd pw, *res;
	char buf[NSS_BUF];
	size_t k = 0, m = 0;
	int r = 0;

	if (!names || !found || !uids) {
		free(names);
		free(found);
		free(uids);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		if (!i || strcmp(l[i].owner, l[i - 1].owner))
			names[k++] = l[i].owner;
	setpwent();
	while (getpwent_r(&pw, buf, sizeof(buf), &res) == 0 && res) {
		const char **at = bsearch(pw.pw_name, names, k, sizeof(*names), by_name);

		if (at && !found[at - names]) {
			found[at - names] = true;
			uids[at - names] = pw.pw_uid;
		}
	}
	endpwent();
	for (size_t i = 0; i < k && !r; i++) {
		char msg[8];
		unsigned uid;
		int e;

		if (found[i])
			continue;
		e = resolve('u', names[i], &uid, msg, sizeof(msg));
		if (e == 0) {
			found[i] = true;
			uids[i] = (uid_t)uid;
		} else if (e == -EINVAL) {
			p->subuid_owners_unknown++;
		} else {
			/* the lookup's own want of descriptors or memory: no answer, as for --allow-uid */
			r = e;
		}
	}
	/* each line's owner's uid (l and names alike by owner) */
	for (size_t i = 0, j = 0; i < n; i++) {
		if (i && strcmp(l[i].owner, l[i - 1].owner))
			j++;
		l[i].known = found[j];
		l[i].uid = found[j] ? uids[j] : 0;
	}
	for (size_t i = 0; i < k; i++)
		if (found[i])
			uids[m++] = uids[i];
	qsort(uids, m, sizeof(*uids), by_uid);
	/* distinct: an owner named twice (by name and number, or by two names of its uid) once */
	for (size_t i = 0; i < m; i++)
		if (!p->nr_subuid_owners || p->subuid_owners[p->nr_subuid_owners - 1] != uids[i])
			p->subuid_owners[p->nr_subuid_owners++] = uids[i];
	free(names);
	free(found);
	free(uids);
	return r;
}

/*
 * Each owner's ranges count as the lowest of their starts; then by start,
 * a range overlapping the one before it dropped (and counted).
 */
static int subuids_index(struct policy *p, struct subuid_line *l, size_t n)
{
	size_t k = 0;
	int e;

	if (n == 0)
		return 0;       /* nothing to sort: l may be NULL, which qsort() must not get */
	qsort(l, n, sizeof(*l), by_owner);
	p->subuids = malloc(n * sizeof(*p->subuids));
	p->subuid_owners = malloc(n * sizeof(*p->subuid_owners));
	if (!p->subuids || !p->subuid_owners)
		return -ENOMEM;
	e = owners_resolve(p, l, n);
	if (e < 0)
		return e;
	/*
	 * One account per owner's uid, however the lines name it: by the
	 * string as written, an owner named by name, by number and by an
	 * alias of its uid had three range accounts, a quarter each (a
	 * review: one login held the whole slab by default).
	 */
	qsort(l, n, sizeof(*l), by_account);
	for (size_t i = 0; i < n; i++)
		l[i].r.as = i && same_account(&l[i], &l[i - 1]) ? l[i - 1].r.as : l[i].r.start;
	for (size_t i = 0; i < n; i++)
		p->subuids[i] = l[i].r;
	qsort(p->subuids, n, sizeof(*p->subuids), by_start);
	for (size_t i = 0; i < n; i++) {
		const struct uid_range *r = &p->subuids[i];

		if (k && (uint64_t)p->subuids[k - 1].start + p->subuids[k - 1].count > r->start)
			p->subuids_skipped++;
		else
			p->subuids[k++] = *r;
	}
	p->nr_subuids = k;
	return 0;
}

static int load_subuids(struct policy *p, const char *path, char *err, size_t errlen)
{
	bool fifo;
	FILE *f = open_text(path, &fifo);
	struct subuid_line *l = NULL;
	size_t n = 0, cap = 0;
	char *line;
	bool over, nul;
	int r = 0;

	if (!f) {
		if (errno == ENOENT)
			return 0;       /* no user namespaces configured */
		r = -errno;
		if (fifo)
			snprintf(err, errlen, "subordinate-uid file '%.200s' is a FIFO, not a file", path);
		else
			snprintf(err, errlen, "cannot open subordinate-uid file '%.200s': %s", path, strerror(-r));
		return r;
	}
	line = malloc(LINE_MAX_BYTES);
	if (!line) {
		fclose(f);
		snprintf(err, errlen, "subordinate-uid file '%.200s': out of memory", path);
		return -ENOMEM;
	}
	/* Whole lines (as the policy file's): a split one's tail is not a range; a too long one is skipped. */
	while (read_line(f, line, LINE_MAX_BYTES, &over, &nul) > 0) {
		char *t = line + strspn(line, " \t");

		/*
		 * Over first: a long line with a NUL in it (/dev/zero has no
		 * end) must stop the reading too, or its tail is read as lines.
		 */
		if (over) {             /* the rest unread: this line and any after it skipped, counted as one */
			p->subuids_skipped++;
			break;
		}
		if (nul) {
			p->subuids_skipped++;
			continue;
		}

		t[strcspn(t, "\n")] = '\0';
		if (!*t || *t == '#')
			continue;
		if (n == cap) {
			struct subuid_line *m = cap < MAX_SUBUID_RANGES ?
				realloc(l, (cap ? 2 * cap : 64) * sizeof(*l)) : NULL;

			if (!m) {
				p->subuids_skipped++;
				continue;
			}
			l = m;
			cap = cap ? 2 * cap : 64;
		}
		if (subuid_parse(t, &l[n]))
			n++;
		else
			p->subuids_skipped++;
	}
	if (ferror(f)) {
		r = errno ? -errno : -EIO;
		snprintf(err, errlen, "cannot read subordinate-uid file '%.200s': %s", path, strerror(-r));
	}
	free(line);
	fclose(f);
	if (r == 0 && (r = subuids_index(p, l, n)) < 0)
		snprintf(err, errlen, "subordinate-uid file '%.200s': %s", path, r == -ENOMEM ? "out of memory" :
			 "cannot look its owners up: no descriptors or memory for the user database");
	for (size_t i = 0; i < n; i++)
		free(l[i].owner);
	free(l);
	return r;
}

/* The range holding uid, or NULL. */
static const struct uid_range *range_of(const struct policy *p, uid_t uid)
{
	size_t lo = 0, hi = p->nr_subuids;

	/* the last range starting at or below uid */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (p->subuids[mid].start <= uid)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo && uid - p->subuids[lo - 1].start < p->subuids[lo - 1].count)
		return &p->subuids[lo - 1];
	return NULL;
}

uid_t policy_account_uid(const struct policy *p, uid_t uid)
{
	const struct uid_range *r = range_of(p, uid);

	return r ? r->as : uid;
}

bool policy_has_subuids(const struct policy *p, uid_t uid)
{
	return range_of(p, uid) ||
	       (p->nr_subuid_owners &&
		bsearch(&uid, p->subuid_owners, p->nr_subuid_owners, sizeof(uid), by_uid));
}

int policy_load(struct policy *p, const struct policy_src *src, char *err, size_t errlen)
{
	struct policy n = { .allow_all = src->allow_all };
	char msg[256] = "";
	int r = 0;

	if (src->allow_uid && (r = policy_parse_uids(src->allow_uid, &n.uids, &n.nr_uids, msg, sizeof(msg))) < 0)
		snprintf(err, errlen, "--allow-uid: %s", msg);
	else if (src->allow_gid &&
		 (r = policy_parse_gids(src->allow_gid, &n.gids, &n.nr_gids, msg, sizeof(msg))) < 0)
		snprintf(err, errlen, "--allow-gid: %s", msg);
	else if (src->file && (r = load_file(&n, src->file, err, errlen)) < 0)
		;
	else if (src->subuid_file)
		r = load_subuids(&n, src->subuid_file, err, errlen);
	if (r < 0) {
		policy_free(&n);
		return r;
	}
	policy_free(p);
	*p = n;
	return 0;
}

void policy_free(struct policy *p)
{
	free(p->uids);
	free(p->gids);
	free(p->sessions);
	free(p->subuids);
	free(p->subuid_owners);
	*p = (struct policy){ 0 };
}

int policy_check(const struct policy_src *src, char *err, size_t errlen, size_t *subuid_ranges)
{
	struct policy check = { 0 };
	int r = policy_load(&check, src, err, errlen);

	if (subuid_ranges)
		*subuid_ranges = r == 0 ? check.nr_subuids : 0;
	policy_free(&check);
	return r;
}

static bool has_gid(const struct policy *p, gid_t g)
{
	for (size_t i = 0; i < p->nr_gids; i++)
		if (p->gids[i] == g)
			return true;
	return false;
}

bool policy_admits(const struct policy *p, uid_t self, uid_t uid, gid_t gid,
		   const gid_t *groups, size_t nr_groups)
{
	if (uid == 0 || uid == self || p->allow_all)
		return true;
	for (size_t i = 0; i < p->nr_uids; i++)
		if (p->uids[i] == uid)
			return true;
	if (has_gid(p, gid))
		return true;
	for (size_t i = 0; i < nr_groups; i++)
		if (has_gid(p, groups[i]))
			return true;
	return false;
}

bool policy_session_owner(const struct policy *p, const char *name, uid_t *uid)
{
	for (size_t i = 0; i < p->nr_sessions; i++) {
		const struct session_rule *r = &p->sessions[i];

		if (r->prefix ? strncmp(name, r->name, strlen(r->name)) == 0 : strcmp(name, r->name) == 0) {
			*uid = r->uid;
			return true;
		}
	}
	return false;
}

bool policy_is_open(const struct policy *p)
{
	return p->allow_all || p->nr_uids || p->nr_gids;
}

void policy_describe(const struct policy *p, char *buf, size_t len)
{
	size_t o;

	if (p->allow_all) {
		o = (size_t)snprintf(buf, len, "any local user");
	} else {
		/* A long list is counted, not cut off unsaid at the buffer's end. */
		enum { SHOWN = 16 };

		uid_t self = geteuid();
		size_t listed = 0, shown = 0;

		/* root and our own user always: not named again for the list ("root, uid 0, uid 0") */
		o = self ? (size_t)snprintf(buf, len, "root, uid %u", (unsigned)self) : (size_t)snprintf(buf, len, "root");
		for (size_t i = 0; i < p->nr_uids; i++) {
			if (p->uids[i] == 0 || p->uids[i] == self)
				continue;
			if (listed++ < SHOWN && o < len) {
				o += (size_t)snprintf(buf + o, len - o, ", uid %u", (unsigned)p->uids[i]);
				shown++;
			}
		}
		if (listed > shown && o < len)
			o += (size_t)snprintf(buf + o, len - o, " and %zu more uids", listed - shown);
		for (size_t i = 0; i < p->nr_gids && i < SHOWN && o < len; i++)
			o += (size_t)snprintf(buf + o, len - o, ", gid %u", (unsigned)p->gids[i]);
		if (p->nr_gids > SHOWN && o < len)
			o += (size_t)snprintf(buf + o, len - o, " and %zu more gids", p->nr_gids - SHOWN);
	}
	if (p->nr_sessions && o < len)
		o += (size_t)snprintf(buf + o, len - o, "; %zu session name%s reserved", p->nr_sessions,
				      p->nr_sessions == 1 ? "" : "s");
	if (p->nr_subuids && o < len)
		o += (size_t)snprintf(buf + o, len - o, "; %zu subordinate-uid range%s (each "
				      "owner's counted as one user)", p->nr_subuids, p->nr_subuids == 1 ? "" : "s");
	if (p->subuids_skipped && o < len)
		o += (size_t)snprintf(buf + o, len - o, " (%zu line%s of the file skipped: not owner:start:count, or "
				      "overlapping)", p->subuids_skipped, p->subuids_skipped == 1 ? "" : "s");
	if (p->subuid_owners_unknown && o < len)
		snprintf(buf + o, len - o, " (%zu owner%s no user has: %s ranges counted by the name)",
			 p->subuid_owners_unknown, p->subuid_owners_unknown == 1 ? "" : "s",
			 p->subuid_owners_unknown == 1 ? "its" : "their");
}
