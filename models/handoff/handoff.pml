/*
 * The hand-off protocol of docs/handoff.md, for Spin: the operator's pass
 * (apportion.engine.handoff.step, .recover and engine.set_state), the worker rule
 * (handoff.plan_worker as WorkerState runs it, with the serving lease of worker/_lease.py),
 * pods that are created, terminated, deleted and recreated under their name, worker processes
 * that crash and restart in place, an operator that crashes and restarts, the table deleted or
 * rolled back, and a store that fences writes by token (docs/fencing.md).
 *
 * Bounds (docs/handoff.md, "How we know"): NP = 2 pod names, NU units, MAXINC incarnations
 * (pod uids) per name, table epochs up to MAXE (repairs above it), CRASHES operator crashes,
 * ATTACKS table deletions or rollbacks; -DRESTARTS adds container restarts in place, -DPODS
 * pods terminated and deleted; FAULTS, when set, bounds the faults of all kinds together. Time
 * is discrete: `tick` advances every timer by one; clocks run at the extremes of their rate
 * bound (the operator's timeout fires TMIN ticks after it knew the release, a worker serves W
 * ticks after its last confirmation), which for safety covers every rate in between: an
 * earlier lease end or a later timeout only removes overlaps.
 *
 * Properties:
 *   StopServing  (monitor `stop_serving`, without -DKEEP) at no instant do two pods serve a unit;
 *   KeepServing  (asserts in `claim` and `fenced_write`) no fenced write is accepted from a stale
 *                owner: a store accepts a token only from the incarnation that claimed it last;
 *   Grow         (asserts in `write`) table epochs grow and unit tokens never go down;
 *   Liveness     (`ltl served`, with -DLIVE, pan -a -f) once faults stop, every unit is served
 *                by its target again and again, in every run where each process that stays
 *                able to act does act (Spin's weak fairness).
 *
 * Mutants: each -DM_... switch drops one rule of docs/handoff.md (listed, with the rule,
 * in scripts/model_check.py); Spin must find a counterexample for each: a state that breaks a
 * safety property, or for M_NO_TIMEOUT and M_FENCE_KEPT a fair cycle after the faults stopped
 * in which a unit is never served.
 */

#define NP 2
#ifndef NU
#define NU 2
#endif
#define NONE NP                 /* no pod */
#ifndef MAXE
#define MAXE 5                  /* the operator writes no table above this epoch */
#endif
#ifndef TMIN
#define TMIN 2                  /* handoffTimeout as the fastest operator clock counts it */
#endif
/* W: ticks a worker may serve after its last confirmation, its slowest clock and the time to
 * stop in flight work included: L(1+rho) + S.  The lease inequality is W <= TMIN. */
#ifdef M_LEASE_OUTLIVES_TIMEOUT
#define W (TMIN + 1)
#else
#define W TMIN
#endif
#ifndef MAXINC
#define MAXINC 1                /* incarnations (pod uids) per name */
#endif
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef ATTACKS
#define ATTACKS 1
#endif
/* FAULTS, when set, bounds the faults of every kind together (crashes, table deletions and
 * rollbacks, container deaths, pod terminations and deletions), so that all kinds can be
 * checked at once. */
#ifdef FAULTS
#define FAULT (!quiet && faults < FAULTS)
#define SPEND faults++
#else
#define FAULT (!quiet)
#define SPEND skip
#endif
#define ROLLBACK_LEFT (FAULT && attacks < ATTACKS)
/* LIVE: the liveness check. Faults may stop (`quiet`) in any state, and the target of each
 * unit stays then on a pod that can serve it; after that the operator may write SETTLE tables
 * above MAXE, so that the bound on epochs cannot be what stops it: if it needed more, the
 * check would find a unit never served. */
#ifdef LIVE
#ifndef SETTLE
#define SETTLE 4
#endif
#define EPOCHS (MAXE + quiet * SETTLE)
#else
#define quiet 0
#define EPOCHS MAXE
#endif

typedef Unit {
    byte own;   /* owner pod name, NONE */
    byte tok;   /* the unit's fencing token (unitEpochs[u]) */
    bit rel;    /* releasing */
    byte to;    /* release target, NONE: to nobody */
    byte rep    /* the epoch that first published the release */
};
typedef Table {
    byte ep;
    byte muid[NP];  /* members: the uid recorded for each name, 0: not a member */
    Unit u[NU]
};

/* The API server: the table's ConfigMap, the set's status, the pods and their acks. */
Table cm;
bit cmOk = 1;               /* the ConfigMap exists */
byte reserved;              /* status.reservedEpoch */
byte stEpoch;               /* status.epoch: written after the table, so it may lag */
bit fenced;                 /* status.fencedUntil set */
byte fenceAge;
bit present[NP];
byte uid[NP];
bit term[NP];               /* deletionTimestamp */
byte ackUid[NP];            /* the ack annotation: uid, epoch, pending units */
byte ackEp[NP];
byte ackPend[NP];

/* The operator's memory: the last table it wrote or read intact, and when it learnt of each
 * release (releases_known), as ticks since. Lost when it crashes. */
Table mem;
bit hasMem = 1;
byte tmo[NU];

/* Each pod's worker process: its view of the table (what plan_worker reads of it), the units it
 * holds with their tokens, those it is finishing for a release, and its lease. */
bit up[NP];
byte vEp[NP];
byte vMine[NP];             /* units the view gives it, not releasing */
byte vRel[NP];              /* units the view releases from it */
byte vTok[NP * NU];
byte held[NP * NU];         /* token held, 0: not held (tokens start at 1) */
byte fin[NP];               /* held units being finished for a release */
byte age[NP];               /* ticks since its last confirmation */
byte rdl[NP * NU];          /* for a released unit: ticks since the confirmation before the release */

byte tgt[NU];               /* the placement's target for each unit */

/* The fenced store: the highest token it accepted per unit, and who claimed it. */
byte store[NU];
byte storeWho[NU];

/* Ghosts: the last table written (Grow), the table before it (a rollback restores it), faults. */
byte lastEp;
byte lastTok[NU];
Table old;
byte crashes;
byte attacks;
#ifdef FAULTS
byte faults;
#endif
#ifdef LIVE
bit quiet;
#endif

Table nt;                   /* scratch: the table a pass writes */
byte i, j, e, hi, ow, w, dest;
bit alive, park, acked, dirty;

#define BIT(x) (1 << (x))
#define INC(p) ((p) * 4 + uid[p])
#define PU(p, x) ((p) * NU + (x))
#ifdef KEEP
#define LEASE_OK(a) 1
#define LEASE 0                 /* the table's servingLease: none */
#else
#define LEASE_OK(a) ((a) < W)
#define LEASE W
#endif
/* Serving: held under the token the view gives it (or finishing a release), lease running. */
#define SERVES(p, x) (up[p] && held[PU(p, x)] != 0 && \
    ((((vMine[p] & BIT(x)) != 0) && vTok[PU(p, x)] == held[PU(p, x)] && LEASE_OK(age[p])) || \
     (((fin[p] & BIT(x)) != 0) && LEASE_OK(rdl[PU(p, x)]))))
#define MAX(a, b) ((a) > (b) -> (a) : (b))
#ifdef LIVE
/* A pod a unit can be placed on: present, not terminating (its process may be down). */
#define READY(p) ((p) != NONE && present[p] && !term[p])
#endif

inline copy_table(dst, src) {
    dst.ep = src.ep;
    i = 0;
    do
    :: i < NP -> dst.muid[i] = src.muid[i]; i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NU ->
        dst.u[i].own = src.u[i].own; dst.u[i].tok = src.u[i].tok; dst.u[i].rel = src.u[i].rel;
        dst.u[i].to = src.u[i].to; dst.u[i].rep = src.u[i].rep; i++
    :: else -> break
    od;
    i = 0
}

inline clear_table(t) {
    t.ep = 0;
    i = 0;
    do
    :: i < NP -> t.muid[i] = 0; i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NU -> t.u[i].own = NONE; t.u[i].tok = 0; t.u[i].rel = 0; t.u[i].to = 0; t.u[i].rep = 0; i++
    :: else -> break
    od;
    i = 0
}

/* A claim: the empty fenced write a worker makes in on_acquire (docs/fencing.md). */
inline claim(p, x, t) {
    assert(t > store[x] || (t == store[x] && storeWho[x] == INC(p)));   /* KeepServing */
    store[x] = t;
    storeWho[x] = INC(p)
}

/* The operator writes nt: epoch reserved in the status first, then the ConfigMap (the status's
 * epoch follows later: `report`). */
inline write() {
    assert(nt.ep > lastEp);                                             /* Grow */
    i = 0;
    do
    :: i < NU -> assert(nt.u[i].tok >= lastTok[i]); lastTok[i] = nt.u[i].tok;
        /* releases_known: a release is timed from when this write returned */
        if
        :: nt.u[i].rel && !(mem.u[i].rel && mem.u[i].rep == nt.u[i].rep && hasMem) -> tmo[i] = 0
        :: !nt.u[i].rel -> tmo[i] = 0
        :: else -> skip
        fi;
        i++
    :: else -> break
    od;
    lastEp = nt.ep;
    if
    :: nt.ep > reserved -> reserved = nt.ep
    :: else -> skip
    fi;
    /* `old` is what a rollback restores: kept only while one can still happen, so that
     * states differing in it alone are one state */
    if
    :: ROLLBACK_LEFT -> copy_table(old, cm)
    :: else -> clear_table(old)
    fi;
    copy_table(cm, nt);
    cmOk = 1;
    copy_table(mem, nt);
    hasMem = 1
}

/* engine.handoff.recover with SetState.resume: dirty when the table must be repaired, nt the
 * repair. */
inline recover() {
    hi = MAX(stEpoch, MAX((cmOk -> cm.ep : 0), (hasMem -> mem.ep : 0)));
#ifndef M_REPAIR_IGNORES_RESERVATION
    hi = MAX(hi, reserved);
#endif
    dirty = 0;
    if
    :: !cmOk -> dirty = (hi != 0)
    :: cmOk && hasMem && cm.ep < mem.ep -> dirty = 1
    :: cmOk && !hasMem && cm.ep < MAX(reserved, stEpoch) -> dirty = 1
    :: else -> skip
    fi;
    if
    :: dirty && hasMem -> copy_table(nt, mem); nt.ep = hi + 1
    :: dirty && !hasMem ->
        /* no copy survived: the fence, every unit unowned under the new epoch */
        clear_table(nt);
        nt.ep = hi + 1;
        i = 0;
        do
        :: i < NU -> nt.u[i].tok = nt.ep; i++
        :: else -> break
        od;
        i = 0;
        fenced = 1;
        fenceAge = 0
    :: !dirty && cmOk -> copy_table(mem, cm); hasMem = 1
    :: !dirty && !cmOk -> clear_table(mem); hasMem = 1     /* a new set: the template */
    fi
}

/* handoffTimeout has passed since the operator knew of unit j's release. */
#ifdef M_NO_TIMEOUT
#define TIMED_OUT 0
#else
#define TIMED_OUT (tmo[j] >= TMIN)
#endif

/* engine.handoff.step on the table in memory (the one just read), one unit `j`. */
inline advance() {
    ow = mem.u[j].own;
    w = tgt[j];
    alive = (ow != NONE && present[ow] && uid[ow] == mem.muid[ow]);
    park = (alive && w == ow && term[ow]);
    dest = ((w != NONE && present[w] && !term[w]) -> w : NONE);
    acked = (alive && mem.u[j].rel && ackUid[ow] == uid[ow] && (ackPend[ow] & BIT(j)) == 0 &&
             ackEp[ow] <= mem.ep
#ifndef M_ACK_EPOCH_IGNORED
             && mem.u[j].rep <= ackEp[ow]
#endif
            );
#ifdef M_NO_ACK_WAIT
    acked = (alive && mem.u[j].rel);
#endif
    if
    :: alive && !mem.u[j].rel && (w == NONE || w == ow) && !park -> skip
    :: park && !mem.u[j].rel ->
#ifdef M_NOBODY_WITHOUT_RELEASE
        nt.u[j].own = NONE; nt.u[j].tok = nt.ep
#else
        nt.u[j].rel = 1; nt.u[j].to = NONE; nt.u[j].rep = nt.ep
#endif
    :: park && mem.u[j].rel && (acked || TIMED_OUT) ->
        nt.u[j].own = NONE; nt.u[j].tok = nt.ep; nt.u[j].rel = 0; nt.u[j].to = 0; nt.u[j].rep = 0
    :: park && mem.u[j].rel && !acked && !TIMED_OUT && mem.u[j].to != NONE -> nt.u[j].to = NONE
    :: park && mem.u[j].rel && !acked && !TIMED_OUT && mem.u[j].to == NONE -> skip
    :: !park && ow == NONE && dest != NONE -> nt.u[j].own = dest; nt.u[j].tok = nt.ep
    :: !park && ow == NONE && dest == NONE -> skip
    :: !park && ow != NONE && !alive ->    /* OwnerGone: the deletion is the fence */
        nt.u[j].own = dest; nt.u[j].tok = nt.ep; nt.u[j].rel = 0; nt.u[j].to = 0; nt.u[j].rep = 0
    :: !park && alive && !mem.u[j].rel && dest != NONE && dest != ow ->
        nt.u[j].rel = 1; nt.u[j].to = dest; nt.u[j].rep = nt.ep
    :: !park && alive && !mem.u[j].rel && (dest == NONE || dest == ow) -> skip
    :: !park && alive && mem.u[j].rel && (dest == NONE || dest == ow) ->   /* cancelled */
        nt.u[j].rel = 0; nt.u[j].to = 0; nt.u[j].rep = 0
    :: !park && alive && mem.u[j].rel && dest != NONE && dest != ow && (acked || TIMED_OUT) ->
#ifdef M_TOKEN_KEPT
        nt.u[j].own = dest; nt.u[j].rel = 0; nt.u[j].to = 0; nt.u[j].rep = 0
#else
        nt.u[j].own = dest; nt.u[j].tok = nt.ep; nt.u[j].rel = 0; nt.u[j].to = 0; nt.u[j].rep = 0
#endif
    :: !park && alive && mem.u[j].rel && dest != NONE && dest != ow && !acked && !TIMED_OUT ->
        nt.u[j].to = dest                  /* retargeted: since and release epoch kept */
    fi
}

/* Replay markers (tests/unit/test_handoff_replay.py): a line per event, `EV kind args`, and
 * after each pass the published table, `ST ...`. Printed in simulation only: pan ignores them. */
inline show_table() {
    printf("EV pass %d %d %d %d\n", cmOk, cm.ep, cm.muid[0], cm.muid[1]);
    i = 0;
    do
    :: i < NU -> printf("ST %d %d %d %d %d %d\n", i, cm.u[i].own, cm.u[i].tok, cm.u[i].rel, cm.u[i].to, cm.u[i].rep); i++
    :: else -> break
    od;
    i = 0
}

/* The placement's target of unit x, chosen for each pass: any pod or none, which covers every
 * choice the strategy or a restart hold (engine.restarts) can make. Only the pass reads it, so
 * a target chosen anew at each pass is a target that moves at any time, in a third of the
 * states. Once quiet, it stays where `settle` put it. */
inline choose_target(x) {
    if
    :: quiet -> skip
    :: !quiet -> tgt[x] = 0
    :: !quiet -> tgt[x] = 1
    :: !quiet -> tgt[x] = NONE
    fi
}

#ifdef LIVE
/* The target of unit x once faults stop: any pod a unit can be placed on. */
inline settle(x) {
    if
    :: READY(0) -> tgt[x] = 0
    :: READY(1) -> tgt[x] = 1
    fi
}
#endif

/* One pass of the operator: read the table, repair it or step it, write at most one table. */
inline operator_pass() {
    i = 0;
    do
    :: i < NU -> printf("EV target %d %d\n", i, tgt[i]); i++
    :: else -> break
    od;
    recover();
    if
    :: dirty -> write()
#ifdef M_FENCE_KEPT
    :: !dirty && fenced -> skip
#elif !defined(M_FENCE_NOT_WAITED)
    :: !dirty && fenced && fenceAge < TMIN -> skip      /* nothing is placed while fenced */
#endif
    :: else ->
        fenced = 0;
        fenceAge = 0;
        copy_table(nt, mem);
        nt.ep = mem.ep + 1;
        i = 0;
        do
        :: i < NP -> nt.muid[i] = (present[i] -> uid[i] : 0); i++
        :: else -> break
        od;
        j = 0;
        do
        :: j < NU -> advance(); j++
        :: else -> break
        od;
        /* changed? members or units differ from what was read */
        dirty = 0;
        i = 0;
        do
        :: i < NP -> dirty = dirty || nt.muid[i] != mem.muid[i]; i++
        :: else -> break
        od;
        i = 0;
        do
        :: i < NU ->
            dirty = dirty || nt.u[i].own != mem.u[i].own || nt.u[i].tok != mem.u[i].tok ||
                nt.u[i].rel != mem.u[i].rel || nt.u[i].to != mem.u[i].to || nt.u[i].rep != mem.u[i].rep;
            i++
        :: else -> break
        od;
        if
        :: dirty && nt.ep <= EPOCHS -> write()
        :: else -> skip
        fi
    fi;
    show_table();
    clear_table(nt);
    /* the next pass chooses its own target */
    i = 0;
    do
    :: i < NU && !quiet -> tgt[i] = NONE; i++
    :: else -> break
    od;
    i = 0; j = 0; hi = 0; ow = 0; w = 0; dest = 0; alive = 0; park = 0; acked = 0; dirty = 0
}

/* Replay markers: per unit, the token pod p's process holds, whether it is finishing a
 * release of it, whether it serves it. */
inline show_worker(p) {
    j = 0;
    do
    :: j < NU -> printf("WK %d %d %d %d\n", j, held[PU(p, j)], (fin[p] >> j) & 1, SERVES(p, j)); j++
    :: else -> break
    od;
    j = 0
}

/* The worker rule on the ConfigMap's table (plan_worker, as WorkerState.next_transition runs
 * it): stop what is not its own under its token, acquire (claim) what is, finish what is
 * released. */
inline handle(p) {
    j = 0;
    do
    :: j < NU ->
        ow = (cm.muid[p] == uid[p] && cm.u[j].own == p);    /* the view records this incarnation */
        w = cm.u[j].tok;
        if
        :: held[PU(p, j)] != 0 && !(held[PU(p, j)] == w && ow) ->
            held[PU(p, j)] = 0; fin[p] = fin[p] & ~BIT(j)     /* stop */
        :: else -> skip
        fi;
        if
        :: ow && !cm.u[j].rel && held[PU(p, j)] == 0 ->
            claim(p, j, w); held[PU(p, j)] = w                 /* acquire */
        :: ow && cm.u[j].rel && held[PU(p, j)] != 0 -> fin[p] = fin[p] | BIT(j)    /* release */
        :: ow && !cm.u[j].rel -> fin[p] = fin[p] & ~BIT(j)    /* cancelled: goes on serving */
        :: else -> skip
        fi;
        if
        :: ow && cm.u[j].rel && (vRel[p] & BIT(j)) == 0 -> rdl[PU(p, j)] = age[p]
        :: else -> skip
        fi;
        vTok[PU(p, j)] = (ow && !cm.u[j].rel -> w : 0);  /* read only for its own units */
        vMine[p] = (ow && !cm.u[j].rel -> vMine[p] | BIT(j) : vMine[p] & ~BIT(j));
        vRel[p] = (ow && cm.u[j].rel -> vRel[p] | BIT(j) : vRel[p] & ~BIT(j));
        if
        :: (vRel[p] & BIT(j)) == 0 -> rdl[PU(p, j)] = 0
        :: else -> skip
        fi;
        j++
    :: else -> break
    od;
    vEp[p] = cm.ep;
    ow = 0; w = 0;
    printf("EV view %d %d\n", p, cm.ep);
    show_worker(p)
}

/* A process that dies (container restart, or the pod deleted) loses everything it held. */
inline process_gone(p) {
    printf("EV down %d\n", p);
    up[p] = 0; vEp[p] = 0; vMine[p] = 0; vRel[p] = 0; fin[p] = 0; age[p] = 0;
    j = 0;
    do
    :: j < NU -> held[PU(p, j)] = 0; vTok[PU(p, j)] = 0; rdl[PU(p, j)] = 0; j++
    :: else -> break
    od;
    j = 0
}

/* A process starts: a consistent read of the table, confirmed as of now. */
inline process_starts(p) {
    printf("EV start %d\n", p);
    up[p] = 1;
    if
    :: cmOk -> handle(p); age[p] = 0; printf("EV confirm %d\n", p); show_worker(p)
    :: else -> age[p] = W
    fi
}

/* A worker may write a unit it serves: fenced by its token. */
inline fenced_write(p, x) {
    if
    :: held[PU(p, x)] >= store[x] -> assert(storeWho[x] == INC(p))    /* KeepServing */
    :: else -> skip                                                    /* refused */
    fi
}

/* Processes: Spin's weak fairness (pan -f, for the liveness check) is per process, so each
 * action that must happen eventually is in a process of its own, or with actions that cannot
 * be taken again and again while it waits (a confirmation, enabled after every tick, would
 * starve an ack in the same process). */

/* The worker process of pod p: the watch, the lease's confirmations, a restart in place. */
proctype worker(byte p) {
end:
    do
    /* the worker sees the table (watch) */
    :: d_step { up[p] && cmOk && cm.ep > vEp[p] -> handle(p) }
#ifndef KEEP
    /* the worker confirms its table (a quorum GET that shows it, or a newer one) */
    :: d_step { up[p] && cmOk && cm.ep >= vEp[p] && (age[p] != 0 || cm.ep > vEp[p]) ->
        if
        :: cm.ep > vEp[p] -> handle(p)
        :: else -> skip
        fi;
        age[p] = 0;
        printf("EV confirm %d\n", p);
        show_worker(p) }
#endif
#ifdef RESTARTS
    /* the container restarted in place (same uid) */
    :: d_step { !up[p] && present[p] && !term[p] -> process_starts(p) }
#endif
    od
}

/* Pod p's releases finishing, and its acks on its own pod. */
proctype releaser(byte p) {
end:
    do
    :: d_step { up[p] && (fin[p] & BIT(0)) -> fin[p] = fin[p] & ~BIT(0); held[PU(p, 0)] = 0;
        printf("EV finished %d 0\n", p); show_worker(p) }
#if NU > 1
    :: d_step { up[p] && (fin[p] & BIT(1)) -> fin[p] = fin[p] & ~BIT(1); held[PU(p, 1)] = 0;
        printf("EV finished %d 1\n", p); show_worker(p) }
#endif
    :: d_step { up[p] && present[p] &&
        (ackUid[p] != uid[p] || ackEp[p] != vEp[p] || ackPend[p] != (fin[p] & vRel[p])) ->
        ackUid[p] = uid[p]; ackEp[p] = vEp[p]; ackPend[p] = fin[p] & vRel[p];
        printf("EV ack %d %d %d %d\n", p, ackUid[p], ackEp[p], ackPend[p]) }
    od
}

#ifndef LIVE
/* Pod p's fenced writes to the store. They change no state, so the liveness check, which
 * has no assertion to make of them, leaves them out. */
proctype writer(byte p) {
end:
    do
    :: d_step { SERVES(p, 0) -> fenced_write(p, 0) }
#if NU > 1
    :: d_step { SERVES(p, 1) -> fenced_write(p, 1) }
#endif
    od
}
#endif

#if defined(RESTARTS) || defined(PODS)
/* Faults of pod p. */
proctype pod_faults(byte p) {
end:
    do
#ifdef RESTARTS
    /* the container dies (it restarts in place: `worker`) */
    :: d_step { FAULT && up[p] -> SPEND; process_gone(p) }
#endif
#ifdef PODS
    /* the pod is terminated (deletionTimestamp, SIGTERM), then deleted once its process is gone */
    :: d_step { FAULT && present[p] && !term[p] -> SPEND; term[p] = 1; printf("EV term %d\n", p) }
    :: d_step { FAULT && present[p] -> SPEND; process_gone(p); present[p] = 0; term[p] = 0;
        ackUid[p] = 0; ackEp[p] = 0; ackPend[p] = 0; printf("EV gone %d\n", p) }
    /* a new incarnation of the name (StatefulSet) */
    :: d_step { !quiet && !present[p] && uid[p] < MAXINC -> present[p] = 1; uid[p]++;
        printf("EV pod %d %d\n", p, uid[p]); process_starts(p) }
#endif
    od
}
#endif

/* The operator's crashes, the table's deletions and rollbacks; for the liveness check they may
 * stop: `quiet`. */
proctype nemesis() {
end:
    do
    :: d_step { FAULT && hasMem && crashes < CRASHES -> SPEND; crashes++; hasMem = 0; clear_table(mem);
        printf("EV crash\n");
        i = 0;
        do
        :: i < NU -> tmo[i] = 0; i++
        :: else -> break
        od;
        i = 0 }
    :: d_step { FAULT && cmOk && attacks < ATTACKS && lastEp > 0 -> SPEND; attacks++; cmOk = 0;
        printf("EV delete\n") }
    :: d_step { FAULT && cmOk && attacks < ATTACKS && lastEp > 1 -> SPEND; attacks++; copy_table(cm, old);
        printf("EV rollback\n") }
#ifdef LIVE
    /* faults stop, and the target of every unit stays on a pod that can serve it */
    :: atomic { !quiet && (READY(0) || READY(1)) ->
        settle(0);
#if NU > 1
        settle(1);
#endif
        quiet = 1; printf("EV quiet %d\n", EPOCHS) }
#endif
    od
}

/* Time passes. */
proctype clock() {
end:
    do
    :: d_step {
        printf("EV tick\n");
        i = 0;
        do
        :: i < NU -> if :: hasMem && mem.u[i].rel && tmo[i] < TMIN -> tmo[i]++ :: else -> skip fi; i++
        :: else -> break
        od;
        i = 0;
        if :: fenced && fenceAge < TMIN -> fenceAge++ :: else -> skip fi;
#ifndef KEEP
        do
        :: i < NP ->
            if :: up[i] && age[i] < W -> age[i]++ :: else -> skip fi;
            j = 0;
            do
            :: j < NU -> if :: (vRel[i] & BIT(j)) && rdl[PU(i, j)] < W -> rdl[PU(i, j)]++ :: else -> skip fi; j++
            :: else -> break
            od;
            i++
        :: else -> break
        od;
#endif
        i = 0;
        do
        :: i < NP -> printf("EV serving %d\n", i); show_worker(i); i++
        :: else -> break
        od;
        i = 0; j = 0 }
    od
}

#ifndef KEEP
#ifndef LIVE
/* StopServing: never two pods serving one unit. */
#if NU > 1
#define OVERLAP ((SERVES(0, 0) && SERVES(1, 0)) || (SERVES(0, 1) && SERVES(1, 1)))
#else
#define OVERLAP (SERVES(0, 0) && SERVES(1, 0))
#endif
active proctype stop_serving() {
end:
    atomic { OVERLAP -> assert(false) }
}
#endif
#endif

#ifdef LIVE
/* Liveness: once faults stop, every unit is served by its target again and again (`quiet`
 * stays set, so each later state has a later one where the unit is served). The target is a
 * pod once quiet; the claim may still evaluate SERVED before, where it may be NONE. */
#define SERVED(x) (tgt[x] != NONE && SERVES(tgt[x], x))
#if NU > 1
ltl served { [] (quiet -> (<> SERVED(0) && <> SERVED(1))) }
#else
ltl served { [] (quiet -> <> SERVED(0)) }
#endif
#endif

/* The operator: its passes and the status's epoch, reported after the table. */
active proctype world() {
    d_step {
        clear_table(cm); clear_table(mem); clear_table(old); clear_table(nt);
        do
        :: i < NU -> tgt[i] = NONE; i++
        :: else -> break
        od;
        i = 0;
        printf("EV lease %d\n", LEASE);
        present[0] = 1; uid[0] = 1; process_starts(0);
        present[1] = 1; uid[1] = 1; process_starts(1)
    };
    atomic {
        run worker(0); run worker(1); run releaser(0); run releaser(1);
#ifndef LIVE
        run writer(0); run writer(1);
#endif
#if defined(RESTARTS) || defined(PODS)
        run pod_faults(0); run pod_faults(1);
#endif
        run nemesis(); run clock()
    };
end:
    do
    :: atomic {
        choose_target(0);
#if NU > 1
        choose_target(1);
#endif
        d_step { operator_pass() } }
    :: d_step { hasMem && stEpoch < mem.ep -> stEpoch = mem.ep; printf("EV report %d\n", stEpoch) }
    od
}
