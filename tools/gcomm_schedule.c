/*
 * tools/gcomm_schedule.c - gcomm_schedule: one collective's schedule for n ranks, printed as a
 * table and drawn as an SVG picture, for readers who want to see how an algorithm moves data.
 *
 *   gcomm_schedule --coll allreduce --algo ring -n 4 [--count N] [--chunk N] [--root R]
 *                  [--svg FILE] [--steps]
 *
 * The steps are gcomm's own: every rank's are computed by gcomm_sched.h (gcommSchedAlgo,
 * gcommSchedNumSteps, gcommSchedGetStep), the functions the host executor and the GPU kernels
 * run, so the table is what gcomm does and never a second description of it. One channel is
 * shown (the library cuts a large buffer into channels, each running this schedule on its part).
 *
 * To show steps that happen at the same time on one row, the tool plays the schedule as the host
 * executor does: in each round every rank runs its next step if the FIFOs it reads hold a slot
 * sent in an earlier round and the FIFOs it writes have room (GCOMM_STEPS slots each). The k-th
 * slot rank a sends to rank b is the k-th that b receives from a, so each receive is matched
 * with the step that sent it: the arrows of the picture.
 *
 * Output: the table (a row per round, a column per rank) on stdout; --steps prints one line per
 * step instead (key=value fields, for scripts: test/test_schedule.sh checks them); --svg FILE
 * draws the picture (ranks as lanes, rounds as rows, an arrow per slot sent). The exit status is
 * 2 for bad arguments, 1 when the schedule is broken (a rank waits forever, or a slot sent is
 * never received), else 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gcomm_sched.h"

#define MAX_RANKS 64
#define MAX_STEPS 100000 /* of all ranks together: the table is for reading */
#define TEXT 96          /* a cell's text */

static const struct {
  const char *name, *title;
  int func, perRank; /* perRank: count is each rank's block (the buffers hold n blocks) */
} colls[] = {
    {"allreduce", "all-reduce", gcommFuncAllReduce, 0},
    {"broadcast", "broadcast", gcommFuncBroadcast, 0},
    {"reduce", "reduce", gcommFuncReduce, 0},
    {"allgather", "all-gather", gcommFuncAllGather, 1},
    {"reducescatter", "reduce-scatter", gcommFuncReduceScatter, 1},
    {"alltoall", "all-to-all", gcommFuncAllToAll, 1},
    {"gather", "gather", gcommFuncGather, 1},
    {"scatter", "scatter", gcommFuncScatter, 1},
};
#define NCOLLS ((int)(sizeof(colls) / sizeof(colls[0])))
/* the names GCOMM_ALGO takes, in gcommAlgo_t's order */
static const char* const algoNames[gcommNumAlgos] = {"ring", "tree", "direct", "twoshot", "recdbl"};

typedef struct {
  int coll, algo, n, root, steps;
  size_t count, chunk;
  const char* svg;
} options_t;

typedef struct {
  gcommStep_t st;
  int rank;
  long index, round;
  long from[2]; /* for recvPeer[i]: the cell (of schedule_t.cells) whose step sent the slot */
} cell_t;

typedef struct {
  options_t o;
  int algo; /* the algorithm that runs (gcommSchedAlgo) */
  cell_t* cells;
  long nCells, nRounds;
  long first[MAX_RANKS + 1]; /* rank r's steps are cells[first[r] .. first[r+1]) */
} schedule_t;

/* ---- the steps, from gcomm_sched.h ---------------------------------------------------------- */

static gcommSched_t schedOf(const schedule_t* s, int rank) {
  gcommSched_t g;
  memset(&g, 0, sizeof(g));
  g.func = colls[s->o.coll].func;
  g.algo = s->algo;
  g.nranks = s->o.n;
  g.rank = rank;
  g.root = s->o.root;
  g.count = s->o.count;
  g.chanOff = 0;
  g.chanCount = s->o.count;
  g.chunk = s->o.chunk;
  g.align = 1;
  return g;
}

/* Every rank's steps, in order. Returns 0, or -1 when there are too many to show. */
static int loadSteps(schedule_t* s) {
  long total = 0;
  for (int r = 0; r < s->o.n; r++) {
    gcommSched_t g = schedOf(s, r);
    s->first[r] = total;
    total += gcommSchedNumSteps(&g);
  }
  s->first[s->o.n] = total;
  if (total > MAX_STEPS) {
    fprintf(stderr,
            "gcomm_schedule: %ld steps, more than %d to show: a smaller --count or a "
            "larger --chunk\n",
            total, MAX_STEPS);
    return -1;
  }
  s->cells = calloc(total ? total : 1, sizeof(cell_t));
  if (s->cells == NULL) return -1;
  s->nCells = total;
  for (int r = 0; r < s->o.n; r++) {
    gcommSched_t g = schedOf(s, r);
    for (long k = s->first[r]; k < s->first[r + 1]; k++) {
      cell_t* c = &s->cells[k];
      gcommSchedGetStep(&g, k - s->first[r], &c->st);
      c->rank = r;
      c->index = k - s->first[r];
      c->round = -1;
      c->from[0] = c->from[1] = -1;
    }
  }
  return 0;
}

/* ---- playing the schedule round by round ----------------------------------------------------- */

typedef struct {
  long slot[GCOMM_STEPS]; /* the sending cell of each slot in flight, oldest first */
  long sentRound[GCOMM_STEPS];
  int head, used;
} fifo_t;

typedef struct {
  fifo_t* fifos; /* fifos[from * n + to] */
  long next[MAX_RANKS];
} player_t;

static fifo_t* fifoOf(const schedule_t* s, player_t* p, int from, int to) {
  return &p->fifos[from * s->o.n + to];
}

/* Whether cell c can run in round t: what it reads arrived before t, what it writes has room. */
static int canRun(const schedule_t* s, player_t* p, const cell_t* c, long t) {
  for (int i = 0; i < 2; i++) {
    int peer = c->st.recvPeer[i];
    if (peer < 0) continue;
    fifo_t* f = fifoOf(s, p, peer, c->rank);
    int want = i == 1 && c->st.recvPeer[0] == peer ? 2 : 1; /* the slot after the first */
    if (f->used < want || f->sentRound[(f->head + want - 1) % GCOMM_STEPS] >= t) return 0;
  }
  for (int i = 0; i < 2; i++) {
    int peer = c->st.sendPeer[i];
    if (peer < 0) continue;
    int want = i == 1 && c->st.sendPeer[0] == peer ? 2 : 1;
    if (fifoOf(s, p, c->rank, peer)->used + want > GCOMM_STEPS) return 0;
  }
  return 1;
}

static void runCell(const schedule_t* s, player_t* p, long k, long t) {
  cell_t* c = &s->cells[k];
  c->round = t;
  for (int i = 0; i < 2; i++) {
    if (c->st.recvPeer[i] < 0) continue;
    fifo_t* f = fifoOf(s, p, c->st.recvPeer[i], c->rank);
    c->from[i] = f->slot[f->head];
    f->head = (f->head + 1) % GCOMM_STEPS;
    f->used--;
  }
  for (int i = 0; i < 2; i++) {
    if (c->st.sendPeer[i] < 0) continue;
    fifo_t* f = fifoOf(s, p, c->rank, c->st.sendPeer[i]);
    int at = (f->head + f->used++) % GCOMM_STEPS;
    f->slot[at] = k;
    f->sentRound[at] = t;
  }
}

/* Says which rank waits on what when no rank can go on. */
static void reportStall(const schedule_t* s, const player_t* p, long t) {
  fprintf(stderr, "gcomm_schedule: the schedule stalls in round %ld:", t);
  for (int r = 0; r < s->o.n; r++) {
    if (p->next[r] == s->first[r + 1]) continue;
    const gcommStep_t* st = &s->cells[p->next[r]].st;
    fprintf(stderr, " rank %d at step %ld (receives from %d %d, sends to %d %d);", r,
            p->next[r] - s->first[r], st->recvPeer[0], st->recvPeer[1], st->sendPeer[0],
            st->sendPeer[1]);
  }
  fprintf(stderr, "\n");
}

/* Says which slots were sent and never received, once every rank is done. Returns how many. */
static int reportUnreceived(const schedule_t* s, player_t* p) {
  int lost = 0;
  for (int a = 0; a < s->o.n; a++)
    for (int b = 0; b < s->o.n; b++) {
      fifo_t* f = fifoOf(s, p, a, b);
      if (f->used == 0) continue;
      fprintf(stderr, "gcomm_schedule: rank %d sends %d slot%s that rank %d never receives\n", a,
              f->used, f->used == 1 ? "" : "s", b);
      lost += f->used;
    }
  return lost;
}

/* Gives every cell its round and its senders. Returns 0, or -1 when the schedule stalls. */
static int play(schedule_t* s) {
  player_t p;
  int n = s->o.n, ready[MAX_RANKS], left = 1;
  p.fifos = calloc((size_t)n * n, sizeof(fifo_t));
  if (p.fifos == NULL) return -1;
  for (int r = 0; r < n; r++) p.next[r] = s->first[r];
  long t;
  for (t = 0; left; t++) {
    int any = 0;
    left = 0;
    for (int r = 0; r < n; r++) { /* decided on the state at the round's start */
      ready[r] = p.next[r] < s->first[r + 1] && canRun(s, &p, &s->cells[p.next[r]], t);
      any |= ready[r];
    }
    for (int r = 0; r < n; r++)
      if (ready[r]) runCell(s, &p, p.next[r]++, t);
    for (int r = 0; r < n; r++) left |= p.next[r] < s->first[r + 1];
    if (left && !any) {
      reportStall(s, &p, t);
      free(p.fifos);
      return -1;
    }
  }
  s->nRounds = t;
  int lost = reportUnreceived(s, &p);
  free(p.fifos);
  return lost ? -1 : 0;
}

/* ---- words for a step ------------------------------------------------------------------------ */

static const char* bufName(int buf) {
  return buf == GCOMM_BUF_IN        ? "in"
         : buf == GCOMM_BUF_OUT     ? "out"
         : buf == GCOMM_BUF_SCRATCH ? "scr"
                                    : "-";
}

/* "in[3]" or "in[4..7]" (inclusive) */
static void range(char* out, size_t len, int buf, size_t off, size_t count) {
  if (count == 1)
    snprintf(out, len, "%s[%zu]", bufName(buf), off);
  else
    snprintf(out, len, "%s[%zu..%zu]", bufName(buf), off, off + count - 1);
}

/* The value a step computes: "in[2] + recv 3" (src op recv, the executors' order), "recv 3",
 * "in[3]"; empty when it moves nothing. */
static void describeValue(char* out, size_t len, const gcommStep_t* st) {
  char src[40] = "";
  size_t at = 0;
  out[0] = '\0';
  if (st->count == 0) return;
  if (st->src != GCOMM_BUF_NONE) range(src, sizeof(src), st->src, st->srcOff, st->count);
  int nRecv = (st->recvPeer[0] >= 0) + (st->recvPeer[1] >= 0);
  if (nRecv == 0 || st->reduce) at += snprintf(out + at, len - at, "%s", src);
  for (int i = 0; i < 2 && at < len; i++) {
    if (st->recvPeer[i] < 0) continue;
    const char* sep = at == 0 ? "" : " + ";
    at += snprintf(out + at, len - at, "%srecv %d", sep, st->recvPeer[i]);
  }
}

/* Where the value goes: "out[0], send 1" */
static void describeTargets(char* out, size_t len, const gcommStep_t* st) {
  size_t at = 0;
  out[0] = '\0';
  if (st->count == 0) return;
  if (st->dst != GCOMM_BUF_NONE) {
    range(out, len, st->dst, st->dstOff, st->count);
    at = strlen(out);
  }
  for (int i = 0; i < 2 && at < len; i++) {
    if (st->sendPeer[i] < 0) continue;
    const char* sep = at == 0 ? "send " : i == 1 && st->sendPeer[0] >= 0 ? "," : ", send ";
    at += snprintf(out + at, len - at, "%s%d", sep, st->sendPeer[i]);
  }
}

/* A table cell: "in[2] + recv 3 -> send 1"; "(nothing to move)" for a step of no data. */
static void describe(char* out, size_t len, const gcommStep_t* st, const char* arrow) {
  char value[TEXT / 2 - 4], targets[TEXT / 2 - 4];
  describeValue(value, sizeof(value), st);
  describeTargets(targets, sizeof(targets), st);
  if (value[0] == '\0')
    snprintf(out, len, "(nothing to move)");
  else
    snprintf(out, len, "%s %s %s", value, arrow, targets);
}

/* The data a slot from this step carries, for an arrow's label: "[3]", "[4..7]". */
static void slotLabel(char* out, size_t len, const gcommStep_t* st) {
  size_t off = st->dst != GCOMM_BUF_NONE ? st->dstOff : st->srcOff;
  if (st->count == 1)
    snprintf(out, len, "[%zu]", off);
  else
    snprintf(out, len, "[%zu..%zu]", off, off + st->count - 1);
}

/* ---- the table and the step lines ------------------------------------------------------------ */

static void printHeader(const schedule_t* s) {
  const options_t* o = &s->o;
  long most = 0;
  for (int r = 0; r < o->n; r++)
    if (s->first[r + 1] - s->first[r] > most) most = s->first[r + 1] - s->first[r];
  printf("# %s on %d ranks, algorithm %s", colls[o->coll].title, o->n, algoNames[s->algo]);
  if (s->algo != o->algo && gcommSchedAlgo(colls[o->coll].func, o->algo) == o->algo)
    printf(" (%s does not fit: it needs 2^(ceil(log2 n) - 1) blocks in a chunk)",
           algoNames[o->algo]);
  else if (s->algo != o->algo)
    printf(" (%s has no %s: gcomm runs this)", colls[o->coll].name, algoNames[o->algo]);
  printf(": %ld round%s, a rank runs at most %ld step%s\n", s->nRounds, s->nRounds == 1 ? "" : "s",
         most, most == 1 ? "" : "s");
  printf("# count %zu%s, chunk %zu (elements a FIFO slot holds)", o->count,
         colls[o->coll].perRank ? " per rank" : "", o->chunk);
  if (colls[o->coll].func != gcommFuncAllReduce && colls[o->coll].func != gcommFuncAllGather &&
      colls[o->coll].func != gcommFuncReduceScatter && colls[o->coll].func != gcommFuncAllToAll)
    printf(", root %d", o->root);
  printf(
      "\n# in[i], out[i]: element i of the rank's input and output buffers (i..j: i to j;\n"
      "# scr[i]: of its scratch, where a binomial gather or scatter holds a subtree's blocks);\n"
      "# recv p: the slot rank p sent; +: the reduction op; -> where the value goes: the\n"
      "# output buffer and/or send q (into the FIFO to rank q). A row is a round: the steps\n"
      "# that can run at once (\".\": the rank waits); a rank receives a slot in a round\n"
      "# after the one it was sent in.\n");
}

/* The cell of rank r in round t, or NULL when r runs no step then. */
static const cell_t* cellAt(const schedule_t* s, int r, long t) {
  for (long k = s->first[r]; k < s->first[r + 1]; k++)
    if (s->cells[k].round == t) return &s->cells[k];
  return NULL;
}

/* Rank r's cell in round t: its step, "." while it waits, "" once it is done. */
static void cellText(char* out, size_t len, const schedule_t* s, int r, long t) {
  const cell_t* c = cellAt(s, r, t);
  int waits = s->first[r + 1] > s->first[r] && s->cells[s->first[r + 1] - 1].round > t;
  if (c != NULL)
    describe(out, len, &c->st, "->");
  else
    snprintf(out, len, "%s", waits ? "." : "");
}

/* A round's row; no blanks after its last cell. */
static void printRow(const schedule_t* s, long t, const int* width) {
  char text[MAX_RANKS][TEXT];
  int last = 0;
  for (int r = 0; r < s->o.n; r++) {
    cellText(text[r], TEXT, s, r, t);
    if (text[r][0] != '\0') last = r;
  }
  printf("%5ld", t);
  for (int r = 0; r <= last; r++) printf(" | %-*s", r < last ? width[r] : 0, text[r]);
  printf("\n");
}

static void printTable(const schedule_t* s) {
  int n = s->o.n, width[MAX_RANKS];
  char text[TEXT];
  for (int r = 0; r < n; r++) {
    width[r] = 7; /* "rank NN" */
    for (long k = s->first[r]; k < s->first[r + 1]; k++) {
      describe(text, sizeof(text), &s->cells[k].st, "->");
      if ((int)strlen(text) > width[r]) width[r] = (int)strlen(text);
    }
  }
  printHeader(s);
  printf("round");
  for (int r = 0; r < n; r++) printf(" | rank %-*d", r + 1 < n ? width[r] - 5 : 0, r);
  printf("\n-----");
  for (int r = 0; r < n; r++) {
    printf("-+-");
    for (int i = 0; i < width[r]; i++) putchar('-');
  }
  printf("\n");
  for (long t = 0; t < s->nRounds; t++) printRow(s, t, width);
}

static void printPeers(const char* key, const int peer[2]) {
  printf(" %s=%s", key, peer[0] < 0 && peer[1] < 0 ? "-" : "");
  for (int i = 0; i < 2; i++)
    if (peer[i] >= 0) printf("%s%d", i == 1 && peer[0] >= 0 ? "," : "", peer[i]);
}

/* The algorithm that runs and the slots of a FIFO, then one line per step: rank, step, round, recv,
 * send, src, dst, count, reduce, final. */
static void printSteps(const schedule_t* s) {
  printf("# algorithm=%s fifo_slots=%d\n", algoNames[s->algo], GCOMM_STEPS);
  for (long k = 0; k < s->nCells; k++) {
    const cell_t* c = &s->cells[k];
    const gcommStep_t* st = &c->st;
    printf("rank=%d step=%ld round=%ld", c->rank, c->index, c->round);
    printPeers("recv", st->recvPeer);
    printPeers("send", st->sendPeer);
    printf(" src=%s:%zu dst=%s:%zu count=%zu reduce=%d final=%d\n", bufName(st->src), st->srcOff,
           bufName(st->dst), st->dstOff, st->count, st->reduce, st->postOp);
  }
}

/* ---- the picture ----------------------------------------------------------------------------- */

/* Geometry in pixels: a lane per rank, a row per round; text is 11 px monospace (7 px a char). */
enum { LEFT = 76, TOP = 92, ROW = 78, BOX_H = 42, CHAR_W = 7, LEGEND = 86 };
#define COLOR_REDUCE "#e6550d"
#define COLOR_COPY "#3182bd"

typedef struct {
  FILE* f;
  int laneW;
} svg_t;

static int isReduce(const gcommStep_t* st) {
  return st->reduce && st->count > 0;
}

static const char* boxFill(const gcommStep_t* st) {
  if (st->count == 0) return "#ffffff";
  if (isReduce(st)) return "#fdd0a2";
  return st->dst != GCOMM_BUF_NONE ? "#c6dbef" : "#e5e5e5";
}

static double boxX(const svg_t* g, int rank) {
  return LEFT + rank * g->laneW + 8;
}
static double boxY(long round) {
  return TOP + round * ROW + (ROW - BOX_H) / 2.0;
}

/* The command that draws this picture again (less --svg), for its caption. */
static void commandOf(char* out, size_t len, const options_t* o) {
  int func = colls[o->coll].func;
  size_t at = snprintf(out, len, "gcomm_schedule --coll %s --algo %s -n %d", colls[o->coll].name,
                       algoNames[o->algo], o->n);
  if (o->count != (colls[o->coll].perRank ? 1 : (size_t)o->n))
    at += snprintf(out + at, len - at, " --count %zu", o->count);
  if (o->chunk != o->count && at < len)
    at += snprintf(out + at, len - at, " --chunk %zu", o->chunk);
  if ((func == gcommFuncBroadcast || func == gcommFuncReduce || func == gcommFuncGather ||
       func == gcommFuncScatter) &&
      o->root != 0 && at < len)
    snprintf(out + at, len - at, " --root %d", o->root);
}

static void svgFrame(const svg_t* g, const schedule_t* s, int width, int height) {
  char cmd[200];
  commandOf(cmd, sizeof(cmd), &s->o);
  fprintf(
      g->f,
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\" "
      "font-size=\"11\">\n<desc>%s</desc>\n"
      "<defs><marker id=\"headReduce\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" "
      "markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" "
      "fill=\"" COLOR_REDUCE
      "\"/></marker><marker id=\"headCopy\" viewBox=\"0 0 10 10\" "
      "refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto\"><path "
      "d=\"M0,0 L10,5 L0,10 z\" fill=\"" COLOR_COPY
      "\"/></marker></defs>\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n"
      "<text x=\"12\" y=\"24\" font-size=\"16\" font-weight=\"bold\">%s on %d ranks: %s</text>\n"
      "<text x=\"12\" y=\"44\" fill=\"#555555\">%s</text>\n",
      width, height, width, height, cmd, colls[s->o.coll].title, s->o.n, algoNames[s->algo], cmd);
  for (int r = 0; r < s->o.n; r++) {
    int x = LEFT + r * g->laneW;
    if (r % 2 == 0)
      fprintf(g->f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%ld\" fill=\"#f4f4f4\"/>\n", x,
              TOP - 24, g->laneW, s->nRounds * ROW + 24);
    fprintf(g->f,
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-weight=\"bold\">rank %d</text>\n",
            x + g->laneW / 2, TOP - 8, r);
  }
  for (long t = 0; t < s->nRounds; t++)
    fprintf(g->f, "<text x=\"12\" y=\"%.1f\" fill=\"#555555\">round %ld</text>\n",
            boxY(t) + BOX_H / 2.0 + 4, t);
}

/* A cubic from (x1,y1) down to (x2,y2); its point at u. */
static void curveAt(double x1, double y1, double x2, double y2, double u, double* x, double* y) {
  double dy = (y2 - y1) * 0.6, a = (1 - u) * (1 - u) * (1 - u), b = 3 * (1 - u) * (1 - u) * u,
         c = 3 * (1 - u) * u * u, d = u * u * u;
  *x = (a + b) * x1 + (c + d) * x2;
  *y = a * y1 + b * (y1 + dy) + c * (y2 - dy) + d * y2;
}

/* The arrow of the slot that cell `to` receives as its i-th, from the step that sent it, labelled
 * just below the sender with the elements it carries when they are a part of the buffer. */
static void svgArrow(const svg_t* g, const schedule_t* s, const cell_t* to, int i) {
  const cell_t* from = &s->cells[to->from[i]];
  int both = to->st.recvPeer[0] >= 0 && to->st.recvPeer[1] >= 0;
  double x1 = boxX(g, from->rank) + (g->laneW - 16) / 2.0, y1 = boxY(from->round) + BOX_H;
  double x2 = boxX(g, to->rank) + (g->laneW - 16) / 2.0 + (both ? (i ? 14 : -14) : 0);
  double y2 = boxY(to->round), lx, ly;
  const char* color = isReduce(&to->st) ? COLOR_REDUCE : COLOR_COPY;
  char label[48];
  fprintf(g->f,
          "<path d=\"M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"none\" stroke=\"%s\" "
          "stroke-width=\"1.6\" marker-end=\"url(#%s)\"/>\n",
          x1, y1, x1, y1 + (y2 - y1) * 0.6, x2, y2 - (y2 - y1) * 0.6, x2, y2, color,
          isReduce(&to->st) ? "headReduce" : "headCopy");
  if (!colls[s->o.coll].perRank && from->st.count == s->o.count) return; /* all of it: no news */
  curveAt(x1, y1, x2, y2, 14.0 / (y2 - y1 > 28 ? y2 - y1 : 28), &lx, &ly);
  slotLabel(label, sizeof(label), &from->st);
  fprintf(g->f,
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"10\" fill=\"%s\" "
          "stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\">%s</text>\n",
          lx, ly + 4, color, label);
}

static void svgBox(const svg_t* g, const cell_t* c) {
  char value[TEXT], targets[TEXT];
  double x = boxX(g, c->rank), y = boxY(c->round), w = g->laneW - 16;
  describeValue(value, sizeof(value), &c->st);
  describeTargets(targets, sizeof(targets), &c->st);
  fprintf(g->f,
          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" rx=\"6\" fill=\"%s\" "
          "stroke=\"#333333\" stroke-width=\"%s\"/>\n",
          x, y, w, BOX_H, boxFill(&c->st), c->st.postOp && c->st.count > 0 ? "2.5" : "0.8");
  if (value[0] == '\0') {
    fprintf(g->f,
            "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#777777\">"
            "(nothing to move)</text>\n",
            x + w / 2, y + 25);
    return;
  }
  fprintf(g->f,
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n"
          "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">\u2192 %s</text>\n",
          x + w / 2, y + 17, value, x + w / 2, y + 33, targets);
}

static void svgLegend(const svg_t* g, long y) {
  static const struct {
    const char *fill, *stroke, *text;
  } boxes[] = {{"#fdd0a2", "0.8", "reduce: local data + received"},
               {"#c6dbef", "0.8", "copy into the output"},
               {"#e5e5e5", "0.8", "send only"},
               {"#ffffff", "2.5", "the final value"}};
  for (int i = 0; i < 4; i++)
    fprintf(g->f,
            "<rect x=\"%d\" y=\"%ld\" width=\"22\" height=\"14\" rx=\"3\" fill=\"%s\" "
            "stroke=\"#333333\" stroke-width=\"%s\"/><text x=\"%d\" y=\"%ld\">%s</text>\n",
            12 + i * 250, y, boxes[i].fill, boxes[i].stroke, 40 + i * 250, y + 11, boxes[i].text);
  fprintf(g->f,
          "<path d=\"M12,%ld h22\" stroke=\"" COLOR_REDUCE
          "\" stroke-width=\"1.6\" "
          "marker-end=\"url(#headReduce)\"/><text x=\"40\" y=\"%ld\">a FIFO slot the receiver "
          "reduces</text>\n<path d=\"M262,%ld h22\" stroke=\"" COLOR_COPY
          "\" stroke-width=\"1.6\" "
          "marker-end=\"url(#headCopy)\"/><text x=\"290\" y=\"%ld\">a FIFO slot the receiver "
          "copies or forwards; [i]: the elements it holds</text>\n",
          y + 32, y + 36, y + 32, y + 36);
  fprintf(g->f,
          "<text x=\"12\" y=\"%ld\" fill=\"#555555\">in[i], out[i]: element i of the rank's "
          "input and output buffers; recv p: the slot from rank p; send q: into the FIFO to rank "
          "q</text>\n",
          y + 60);
}

/* Draws the schedule into path. Returns 0, or -1 when the file cannot be written. */
static int writeSvg(const schedule_t* s, const char* path) {
  svg_t g;
  char text[TEXT];
  size_t longest = 24;
  for (long k = 0; k < s->nCells; k++) {
    describeValue(text, sizeof(text), &s->cells[k].st);
    if (strlen(text) > longest) longest = strlen(text);
    describeTargets(text, sizeof(text), &s->cells[k].st);
    if (strlen(text) + 2 > longest) longest = strlen(text) + 2;
  }
  g.laneW = (int)longest * CHAR_W + 28;
  int width = LEFT + s->o.n * g.laneW + 12, height = TOP + (int)s->nRounds * ROW + LEGEND;
  if (width < 1000) width = 1000; /* the legend's */
  g.f = fopen(path, "w");
  if (g.f == NULL) {
    perror(path);
    return -1;
  }
  svgFrame(&g, s, width, height);
  for (long k = 0; k < s->nCells; k++)
    for (int i = 0; i < 2; i++)
      if (s->cells[k].from[i] >= 0) svgArrow(&g, s, &s->cells[k], i);
  for (long k = 0; k < s->nCells; k++) svgBox(&g, &s->cells[k]);
  svgLegend(&g, TOP + s->nRounds * ROW + 16);
  fprintf(g.f, "</svg>\n");
  if (fclose(g.f) != 0) {
    perror(path);
    return -1;
  }
  return 0;
}

/* ---- arguments ------------------------------------------------------------------------------- */

static int usage(const char* why) {
  if (why) fprintf(stderr, "gcomm_schedule: %s\n", why);
  fprintf(why ? stderr : stdout,
          "usage: gcomm_schedule --coll C --algo A -n N [--count N] [--chunk N] [--root R]\n"
          "                      [--svg FILE] [--steps]\n"
          "  --coll    allreduce broadcast reduce allgather reducescatter alltoall gather scatter\n"
          "  --algo    ring tree direct (oneshot) twoshot recdbl: as GCOMM_ALGO; a collective\n"
          "            without it runs the one gcomm falls back to, as the header line says\n"
          "  -n        ranks (1-%d)\n"
          "  --count   elements: the whole buffer (allreduce, broadcast, reduce) or each rank's\n"
          "            block (the others); default n, or 1 for per-rank blocks\n"
          "  --chunk   elements a FIFO slot holds (default: count, one round)\n"
          "  --root    root of broadcast, reduce, gather, scatter (default 0)\n"
          "  --svg     also draw the schedule into FILE\n"
          "  --steps   one line per step (key=value) instead of the table\n",
          MAX_RANKS);
  return 2;
}

static int nameIndex(const char* name, int coll) {
  if (coll) {
    for (int i = 0; i < NCOLLS; i++)
      if (strcmp(name, colls[i].name) == 0) return i;
    return -1;
  }
  if (strcmp(name, "oneshot") == 0) return gcommAlgoDirect;
  for (int i = 0; i < gcommNumAlgos; i++)
    if (strcmp(name, algoNames[i]) == 0) return i;
  return -1;
}

/* A whole number in [lo, hi], or -1. */
static long number(const char* text, long lo, long hi) {
  char* end;
  long v = strtol(text, &end, 10);
  return *text && *end == '\0' && v >= lo && v <= hi ? v : -1;
}

/* Returns 0, 1 for --help, or 2 (after saying why) for bad arguments. */
static int parseArgs(int argc, char** argv, options_t* o) {
  long count = 0, chunk = 0;
  memset(o, 0, sizeof(*o));
  o->coll = o->algo = o->n = -1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(NULL), 1;
    if (strcmp(a, "--steps") == 0) {
      o->steps = 1;
      continue;
    }
    if (v == NULL) return usage("an option without its value");
    i++;
    if (strcmp(a, "--coll") == 0 && (o->coll = nameIndex(v, 1)) < 0)
      return usage("--coll: not a collective");
    else if (strcmp(a, "--algo") == 0 && (o->algo = nameIndex(v, 0)) < 0)
      return usage("--algo: not an algorithm");
    else if (strcmp(a, "-n") == 0 && (o->n = (int)number(v, 1, MAX_RANKS)) < 0)
      return usage("-n: not a rank count in range");
    else if (strcmp(a, "--count") == 0 && (count = number(v, 1, 1L << 30)) < 0)
      return usage("--count: not a positive number");
    else if (strcmp(a, "--chunk") == 0 && (chunk = number(v, 1, 1L << 30)) < 0)
      return usage("--chunk: not a positive number");
    else if (strcmp(a, "--root") == 0 && (o->root = (int)number(v, 0, MAX_RANKS)) < 0)
      return usage("--root: not a rank");
    else if (strcmp(a, "--svg") == 0)
      o->svg = v;
    else if (strcmp(a, "--coll") && strcmp(a, "--algo") && strcmp(a, "-n") &&
             strcmp(a, "--count") && strcmp(a, "--chunk") && strcmp(a, "--root"))
      return usage("unknown option");
  }
  if (o->coll < 0 || o->algo < 0 || o->n < 0) return usage("--coll, --algo and -n are needed");
  if (o->root >= o->n) return usage("--root: not below -n");
  o->count = count ? (size_t)count : colls[o->coll].perRank ? 1 : (size_t)o->n;
  o->chunk = chunk ? (size_t)chunk : o->count;
  return 0;
}

int main(int argc, char** argv) {
  schedule_t s;
  memset(&s, 0, sizeof(s));
  int rc = parseArgs(argc, argv, &s.o);
  if (rc) return rc == 1 ? 0 : rc;
  s.algo = gcommSchedAlgo(colls[s.o.coll].func, s.o.algo);
  gcommSched_t g = schedOf(&s, 0);
  s.algo = gcommSchedChannelAlgo(&g); /* recursive doubling or binomial where it fits */
  if (loadSteps(&s) != 0 || play(&s) != 0) {
    free(s.cells);
    return 1;
  }
  if (s.o.steps)
    printSteps(&s);
  else
    printTable(&s);
  rc = s.o.svg && writeSvg(&s, s.o.svg) != 0;
  free(s.cells);
  return rc;
}
