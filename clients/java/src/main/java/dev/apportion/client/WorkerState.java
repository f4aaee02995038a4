package dev.apportion.client;

import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;

/**
 * One worker process's view of one PartitionSet or ShardSet (pure, no I/O, not thread-safe):
 * the Java twin of apportion.worker._worker_state.WorkerState.
 *
 * <p>{@code view}: the newest table received; {@code held}: unit → token of every unit this
 * process serves or is finishing; {@code busy}: units whose callback is running (or being
 * retried), left out of new plans until it returns, so a unit is never acquired and released at
 * once; {@code failing}: units whose release callback failed → why. Fencing ({@link #owns})
 * always follows the newest table.
 *
 * <p>A release whose callback fails is not acknowledged: the unit stays held and busy (pending
 * in every ack, listed under {@code failing}) while the worker retries it, until the callback
 * succeeds or the view no longer grants the unit to this process ({@link #retryWanted}).
 */
public final class WorkerState {
  /** Token of units held under an earlier incarnation of the set: matches no unit epoch. */
  private static final long FOREIGN_TOKEN = -1;
  /** Characters of a failing release's message kept for the ack (a Pod's annotations share
   * 256 KiB). */
  public static final int FAILING_MESSAGE_LIMIT = 200;

  /**
   * Callbacks due now, all under the view of {@code epoch}: run {@code stop} first, then the
   * split or merge of {@code resharding} (null: none), then releases and acquisitions.
   */
  public record Transition(
      long epoch,
      Set<String> acquire,
      Set<String> release,
      Set<String> stop,
      Map<String, Long> tokens,
      Resharding resharding) {
    public Transition {
      acquire = Set.copyOf(acquire);
      release = Set.copyOf(release);
      stop = Set.copyOf(stop);
      tokens = Map.copyOf(tokens);
    }
  }

  private final Incarnation me;
  private final String kind;
  private final String namespace;
  private final String name;
  private AssignmentTable view;
  private Map<String, Long> held = new HashMap<>();
  /** The unit count {@code held} is named in (null before the first table). */
  private Integer heldCount;
  private final Set<String> busy = new HashSet<>();
  private final Map<String, String> failing = new HashMap<>();
  private Ack.Suspensions suspensions;
  private boolean draining;
  private Ack written;
  /** The API server went back in time (etcd restored from a backup) since the last ack. */
  private boolean rewound;
  /** Every ack names the set since: a later ack must not take back what the first told. */
  private boolean namesSet;

  public WorkerState(Incarnation me, String kind, String namespace, String name) {
    this.me = me;
    this.kind = kind;
    this.namespace = namespace;
    this.name = name;
  }

  /**
   * Takes {@code table} as the view if it supersedes it; whether it did.
   *
   * @throws IllegalArgumentException a table of another set
   */
  public boolean receive(AssignmentTable table) {
    SetRef ref = table.set();
    if (!ref.kind().equals(kind) || !ref.namespace().equals(namespace) || !ref.name().equals(name)) {
      throw new IllegalArgumentException(
          "table of " + ref.kind() + " " + ref.namespace() + "/" + ref.name()
              + ", not of " + kind + " " + namespace + "/" + name);
    }
    if (!WorkerRule.supersedes(table, view)) {
      if (view != null && ref.uid().equals(view.set().uid()) && table.epoch() < view.epoch()) {
        wentBack(); // the operator never lowers an epoch: a restore did
      }
      return false;
    }
    if (view != null && !ref.uid().equals(view.set().uid())) {
      // A recreated set: unit epochs start over, so a held token could match by chance.
      held.replaceAll((unit, token) -> FOREIGN_TOKEN);
    }
    view = table;
    return true;
  }

  /** The pod incarnation this state is of. */
  public Incarnation me() {
    return me;
  }

  public AssignmentTable view() {
    return view;
  }

  /** Epoch of the view (0 before the first table). */
  public long epoch() {
    return view == null ? 0 : view.epoch();
  }

  /** The callbacks due now, marking their units busy and {@code held} as it will be; null when
   * there is nothing to do. Call again whenever a table arrives or a callback returns. */
  public Transition nextTransition() {
    if (view == null) {
      return null;
    }
    if (heldCount == null || heldCount != view.count()) {
      if (!busy.isEmpty()) {
        return null; // reshape only between callbacks: held must be settled
      }
      return reshape();
    }
    WorkerRule.Plan plan = WorkerRule.plan(view, me, held);
    Set<String> stop = without(plan.stop(), busy);
    Set<String> release = without(plan.release(), busy);
    Set<String> acquire = without(plan.acquire(), busy);
    if (stop.isEmpty() && release.isEmpty() && acquire.isEmpty()) {
      return null;
    }
    stop.forEach(held::remove);
    Map<String, Long> tokens = new HashMap<>();
    for (String unit : acquire) {
      tokens.put(unit, view.units().get(unit).epoch());
    }
    held.putAll(tokens);
    busy.addAll(stop);
    busy.addAll(release);
    busy.addAll(acquire);
    return new Transition(view.epoch(), acquire, release, stop, tokens, null);
  }

  /** The count changed: carry what the resharding rule allows, stop the rest (the next
   * transition acquires afresh whatever is left). */
  private Transition reshape() {
    Integer previous = heldCount;
    WorkerRule.Reshape change =
        previous == null ? null : WorkerRule.reshape(view, me, previous, held);
    heldCount = view.count();
    if (change == null) {
      return nextTransition();
    }
    held = new HashMap<>(change.serving());
    busy.addAll(change.serving().keySet());
    Resharding resharding =
        new Resharding(previous, view.count(), change.carried(), change.load());
    return new Transition(
        view.epoch(), Set.of(), Set.of(), change.dropped(), Map.of(), resharding);
  }

  /** The split or merge callbacks returned ({@code ok}) or threw: then the units are dropped and
   * the next transition acquires them afresh. */
  public void resharded(Set<String> units, boolean ok) {
    acquired(units, ok);
  }

  private static Set<String> without(Set<String> units, Set<String> busy) {
    Set<String> result = new HashSet<>(units);
    result.removeAll(busy);
    return result;
  }

  public void stopped(Set<String> units) {
    busy.removeAll(units);
  }

  /** on_acquire returned ({@code ok}) or threw: then the units are not served, and the next
   * table retries them. */
  public void acquired(Set<String> units, boolean ok) {
    for (String unit : units) {
      busy.remove(unit);
      if (!ok) {
        held.remove(unit);
      }
    }
  }

  public void released(Set<String> units) {
    for (String unit : units) {
      busy.remove(unit);
      held.remove(unit);
      failing.remove(unit);
    }
  }

  /** onRelease threw: the units stay held and busy, unacknowledged, while the worker retries
   * them; the ack lists them as failing with {@code why}. */
  public void releaseFailed(Set<String> units, String why) {
    String message = why.substring(0, Math.min(why.length(), FAILING_MESSAGE_LIMIT));
    for (String unit : units) {
      failing.put(unit, message);
    }
  }

  /**
   * Of {@code units}, whose release failed, those to try again: the view still names this process
   * their owner under the token it holds (releasing, or given back: a release half done is
   * finished before the unit is acquired afresh). The others were taken away (a revoke,
   * handoffTimeout) or renamed by a change of count: give them up.
   */
  public Set<String> retryWanted(Set<String> units) {
    if (view == null || heldCount == null || heldCount != view.count()) {
      return Set.of();
    }
    Map<String, Long> tried = new HashMap<>();
    for (String unit : units) {
      if (held.containsKey(unit)) {
        tried.put(unit, held.get(unit));
      }
    }
    Set<String> wanted = new HashSet<>(tried.keySet());
    wanted.removeAll(WorkerRule.plan(view, me, tried).stop());
    return wanted;
  }

  /** The worker stopped retrying: the units are no longer busy but still held, so the next
   * transition stops them (onRevoke) or the change of count reshapes them. */
  public void releaseAbandoned(Set<String> units) {
    for (String unit : units) {
      busy.remove(unit);
      failing.remove(unit);
    }
  }

  /** Unit → why, for every unit whose release is failing now. */
  public Map<String, String> failing() {
    return Map.copyOf(failing);
  }

  /** Everything still held, given up (process exit); no acknowledgement covers it. */
  public Set<String> dropAll() {
    Set<String> units = Set.copyOf(held.keySet());
    held.clear();
    busy.clear();
    failing.clear();
    return units;
  }

  /** Whether to take new work for {@code unit} now: the view grants it to this incarnation,
   * unreleased, under the token this process acquired it with, and its acquisition is done. */
  public boolean owns(String unit) {
    Long token = held.get(unit);
    return token != null
        && !busy.contains(unit)
        && view != null
        && WorkerRule.isOwner(view, me, unit)
        && view.units().get(unit).epoch() == token;
  }

  public Set<String> myUnits() {
    Set<String> result = new HashSet<>();
    for (String unit : held.keySet()) {
      if (owns(unit)) {
        result.add(unit);
      }
    }
    return result;
  }

  /** The fencing token of a unit this process holds (acquiring, serving or releasing), or null. */
  public Long token(String unit) {
    return held.get(unit);
  }

  /** Unit → token of every unit held. */
  public Map<String, Long> held() {
    return Map.copyOf(held);
  }

  /** The serving lease holds again after running out for {@code suspendedSeconds}: the next ack
   * says so, for the operator to report what nobody could write while it lasted. */
  public void resumed(double suspendedSeconds) {
    long count = suspensions == null ? 1 : suspensions.count() + 1;
    suspensions = new Ack.Suspensions(count, suspendedSeconds);
  }

  public void startDraining() {
    draining = true;
  }

  public boolean draining() {
    return draining;
  }

  /**
   * The API server's objects went back to an earlier state (an etcd restore): the ack on the Pod
   * may be an older one, and the operator may not know the epochs this process has seen. The
   * next ack is written whatever the last one said.
   */
  public void wentBack() {
    written = null;
    rewound = true;
    namesSet = true;
  }

  public boolean rewound() {
    return rewound;
  }

  /** The ack to write now, or null when the last one written says it all already. */
  public Ack ackDue() {
    Ack mine = written != null && written.uid().equals(me.uid()) ? written : null;
    // Also when an earlier process of this very pod left a draining mark behind.
    boolean flagStale = (mine != null && mine.draining()) != draining;
    if (view == null) {
      return flagStale ? new Ack(me.uid(), 0, Set.of(), draining) : null;
    }
    if (!held.isEmpty() && !Integer.valueOf(view.count()).equals(heldCount)) {
      // held is named in the previous count until the reshape: an ack now would call a new
      // unit released whose state is still in its parents here, not handed over.
      return null;
    }
    Ack made = WorkerRule.makeAck(view, me, held.keySet(), draining, failing, suspensions);
    Ack ack = namesSet ? made.naming(view.set().uid()) : made;
    Set<String> released = WorkerRule.releasingUnits(view, me);
    released.removeAll(ack.pending());
    // A change in which releases fail is news for the operator; a new message alone is not
    // (that would be a Pod write per retry).
    Set<String> failed = mine == null ? Set.of() : mine.failing().keySet();
    boolean news = !ack.failing().keySet().equals(failed)
        || !java.util.Objects.equals(ack.suspended(), mine == null ? null : mine.suspended());
    if (rewound || flagStale || news) {
      return ack;
    }
    for (String unit : released) {
      Release release = view.units().get(unit).releasing();
      boolean covered =
          mine != null
              && release.epoch() <= mine.epoch()
              && mine.epoch() <= view.epoch()
              && !mine.pending().contains(unit);
      if (!covered) {
        return ack;
      }
    }
    return null;
  }

  /** The ack now on the Pod (written by this process, or found there at start). */
  public void ackWritten(Ack ack) {
    written = ack;
    rewound = false;
  }

  /** Draining is done: nothing held, nothing owned in the view, every release acknowledged. */
  public boolean drained() {
    if (!held.isEmpty() || !busy.isEmpty()) {
      return false;
    }
    if (view == null) {
      return ackDue() == null;
    }
    return WorkerRule.ownedUnits(view, me).isEmpty() && ackDue() == null;
  }
}
