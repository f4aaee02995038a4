package dev.apportion.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.math.BigDecimal;
import java.math.RoundingMode;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * What a worker writes on its own Pod, annotation {@link AssignmentTable#ackAnnotation()}: "I am
 * pod incarnation {@code uid}; I have processed table {@code epoch}; every unit that table marks
 * releasing from me has been released, except {@code pending}." {@code failing}: pending units
 * whose release callback failed, with why; the worker retries them (optional on the wire).
 * {@code suspended}: the serving lease ran out (null until it has; the operator reports each new
 * one, since none could be written while it lasted). {@code setUid}: the set incarnation whose
 * table {@code epoch} was, written only by a worker that saw the API server go back in time (an
 * etcd restore; null otherwise): the operator then knows epochs up to {@code epoch} were seen.
 */
public record Ack(
    String uid,
    long epoch,
    Set<String> pending,
    boolean draining,
    Map<String, String> failing,
    Suspensions suspended,
    String setUid) {
  private static final ObjectMapper JSON = new ObjectMapper();

  /** How often this pod incarnation stopped serving because its serving lease ran out, and how
   * long the last time lasted, in seconds. */
  public record Suspensions(long count, double lastSeconds) {}

  public Ack {
    pending = Set.copyOf(pending);
    failing = Map.copyOf(failing);
  }

  /** An ack with nothing failing. */
  public Ack(String uid, long epoch, Set<String> pending, boolean draining) {
    this(uid, epoch, pending, draining, Map.of(), null, null);
  }

  /** An ack that tells of no suspension. */
  public Ack(
      String uid, long epoch, Set<String> pending, boolean draining, Map<String, String> failing) {
    this(uid, epoch, pending, draining, failing, null, null);
  }

  /** An ack that names no set. */
  public Ack(
      String uid,
      long epoch,
      Set<String> pending,
      boolean draining,
      Map<String, String> failing,
      Suspensions suspended) {
    this(uid, epoch, pending, draining, failing, suspended, null);
  }

  /** This ack, naming the set incarnation {@code set} (after the API server went back). */
  public Ack naming(String set) {
    return new Ack(uid, epoch, pending, draining, failing, suspended, set);
  }

  /** The annotation value: compact JSON, pending in unit order. */
  public String toAnnotation() {
    ObjectNode doc = JSON.createObjectNode();
    doc.put("uid", uid);
    doc.put("epoch", epoch);
    ArrayNode units = doc.putArray("pending");
    TreeSet<String> ordered = new TreeSet<>(Units.ORDER);
    ordered.addAll(pending);
    ordered.forEach(units::add);
    doc.put("draining", draining);
    if (!failing.isEmpty()) { // absent when empty: an ack with nothing failing is unchanged
      ObjectNode why = doc.putObject("failing");
      Map<String, String> sorted = new TreeMap<>(Units.ORDER);
      sorted.putAll(failing);
      sorted.forEach(why::put);
    }
    if (setUid != null) {
      doc.put("set", setUid);
    }
    if (suspended != null) {
      ObjectNode lease = doc.putObject("suspended");
      lease.put("count", suspended.count());
      // To one decimal as the Python client writes it, so that the same ack reads the same.
      lease.put("lastSeconds",
          BigDecimal.valueOf(suspended.lastSeconds()).setScale(1, RoundingMode.HALF_EVEN));
    }
    return doc.toString();
  }

  public static Ack fromAnnotation(String text) throws AssignmentFormatException {
    JsonNode doc;
    try {
      doc = JSON.readTree(text);
    } catch (java.io.IOException e) {
      throw new AssignmentFormatException("ack annotation is not JSON: " + e.getMessage());
    }
    if (doc == null || !doc.isObject()) {
      throw new AssignmentFormatException("ack annotation must be a JSON object");
    }
    Set<String> pending = new TreeSet<>();
    JsonNode list = doc.path("pending");
    if (!list.isMissingNode()) {
      if (!list.isArray()) {
        throw new AssignmentFormatException("ack annotation: pending must be a list of unit names");
      }
      for (JsonNode unit : list) {
        if (!unit.isTextual()) {
          throw new AssignmentFormatException("ack annotation: pending must be a list of unit names");
        }
        pending.add(unit.asText());
      }
    }
    JsonNode draining = doc.path("draining");
    if (!draining.isMissingNode() && !draining.isBoolean()) {
      throw new AssignmentFormatException("ack annotation: draining must be a boolean");
    }
    Map<String, String> failing = new TreeMap<>();
    JsonNode why = doc.path("failing");
    String notMessages = "ack annotation: failing must map unit names to messages";
    if (!why.isMissingNode() && !why.isObject()) {
      throw new AssignmentFormatException(notMessages);
    }
    for (Map.Entry<String, JsonNode> e : why.properties()) {
      if (!e.getValue().isTextual()) {
        throw new AssignmentFormatException(notMessages);
      }
      failing.put(e.getKey(), e.getValue().asText());
    }
    Suspensions suspended = null;
    JsonNode lease = doc.path("suspended");
    if (!lease.isMissingNode() && !lease.isNull()) {
      JsonNode last = lease.path("lastSeconds");
      if (!last.isNumber() || !(last.asDouble() >= 0) || Double.isInfinite(last.asDouble())) {
        throw new AssignmentFormatException(
            "ack annotation: suspended must hold count and lastSeconds (seconds, >= 0)");
      }
      suspended = new Suspensions(
          Json.count(lease.get("count"), "ack annotation: suspended.count"), last.asDouble());
    }
    JsonNode set = doc.get("set");
    return new Ack(
        Json.string(doc.get("uid"), "ack annotation: uid"),
        Json.count(doc.get("epoch"), "ack annotation: epoch"),
        pending,
        draining.asBoolean(false),
        failing,
        suspended,
        set == null || set.isNull() ? null : Json.string(set, "ack annotation: set"));
  }
}
