package dev.apportion.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.zip.GZIPInputStream;
import java.util.zip.ZipException;

/**
 * Reads the assignment table from its ConfigMaps, in every storage of docs/assignment-format.md:
 * plain JSON ({@code data["assignments.json"]}), gzip ({@code binaryData["assignments.json.gz"]})
 * and gzip split into chunk ConfigMaps with SHA-256 checksums ({@code
 * data["assignments.index.json"]}); documents in the {@code map} and {@code indexed} layouts.
 * The reference implementation is the Python apportion.api.assignment.
 */
public final class AssignmentCodec {
  public static final String API_VERSION = "apportion.dev/v1alpha1";
  public static final String DATA_KEY = "assignments.json";
  public static final String GZIP_KEY = "assignments.json.gz";
  public static final String INDEX_KEY = "assignments.index.json";
  public static final String CHUNK_KEY = "assignments.part";
  /** A reader never inflates more than this, whatever a ConfigMap claims. */
  public static final int MAX_DOCUMENT_BYTES = 64 * 1024 * 1024;

  private static final ObjectMapper JSON = new ObjectMapper();

  private AssignmentCodec() {}

  /** Suffixes of the chunk ConfigMaps to fetch besides the root (usually none). */
  public static List<String> chunkSuffixes(ConfigMapPayload root) throws AssignmentFormatException {
    List<String> suffixes = new ArrayList<>();
    if (root.data().containsKey(INDEX_KEY)) {
      for (JsonNode chunk : index(root).get("chunks")) {
        suffixes.add(chunk.get("suffix").asText());
      }
    }
    return suffixes;
  }

  /**
   * The table held by the root (suffix "") and, when the root is an index, its chunks.
   *
   * @throws IncompleteAssignmentException chunks missing or stale: read the root again
   * @throws AssignmentFormatException the content is invalid
   */
  public static AssignmentTable decode(List<ConfigMapPayload> configMaps)
      throws AssignmentFormatException {
    Map<String, ConfigMapPayload> bySuffix = new HashMap<>();
    for (ConfigMapPayload c : configMaps) {
      bySuffix.put(c.suffix(), c);
    }
    ConfigMapPayload root = bySuffix.get("");
    if (root == null) {
      throw new AssignmentFormatException("no root ConfigMap (suffix '') among the payloads");
    }
    byte[] raw;
    if (root.data().containsKey(DATA_KEY)) {
      raw = root.data().get(DATA_KEY).getBytes(StandardCharsets.UTF_8);
    } else if (root.binaryData().containsKey(GZIP_KEY)) {
      raw = gunzip(unbase64(root.binaryData().get(GZIP_KEY), GZIP_KEY));
    } else if (root.data().containsKey(INDEX_KEY)) {
      raw = gunzip(joinChunks(index(root), bySuffix));
    } else {
      throw new AssignmentFormatException(
          "ConfigMap holds none of " + DATA_KEY + ", " + GZIP_KEY + " (binaryData), " + INDEX_KEY);
    }
    JsonNode doc;
    try {
      doc = JSON.readTree(raw);
    } catch (IOException e) {
      throw new AssignmentFormatException("assignment document is not JSON: " + e.getMessage());
    }
    return fromDocument(doc);
  }

  /** Parses and checks a document of either layout; errors name the offending field. */
  public static AssignmentTable fromDocument(JsonNode doc) throws AssignmentFormatException {
    if (doc == null || !doc.isObject()) {
      throw new AssignmentFormatException("assignment document must be a JSON object");
    }
    if (!API_VERSION.equals(doc.path("apiVersion").asText(null))
        || !"Assignment".equals(doc.path("kind").asText(null))) {
      throw new AssignmentFormatException(
          "unsupported document " + doc.get("apiVersion") + "/" + doc.get("kind"));
    }
    JsonNode setDoc = Json.object(doc.get("set"), "set");
    SetRef set =
        new SetRef(
            Json.string(setDoc.get("kind"), "set.kind"),
            Json.string(setDoc.get("namespace"), "set.namespace"),
            Json.string(setDoc.get("name"), "set.name"),
            Json.string(setDoc.get("uid"), "set.uid"));
    List<Incarnation> members = new ArrayList<>();
    int i = 0;
    for (JsonNode m : Json.array(doc.get("members"), "members")) {
      String path = "members[" + i++ + "]";
      Json.object(m, path);
      members.add(
          new Incarnation(
              Json.string(m.get("name"), path + ".name"), Json.string(m.get("uid"), path + ".uid")));
    }
    Map<String, String> owners = new LinkedHashMap<>();
    Map<String, Long> epochs = new HashMap<>();
    String layout = doc.path("layout").asText("");
    if (doc.path("layout").isTextual() && layout.equals("map")) {
      mapLayout(doc, owners, epochs);
    } else if (doc.path("layout").isTextual() && layout.equals("indexed")) {
      indexedLayout(doc, members, owners, epochs);
    } else {
      throw new AssignmentFormatException(
          "layout: expected 'map' or 'indexed', got " + doc.get("layout"));
    }
    JsonNode releasingDoc = doc.has("releasing") ? doc.get("releasing") : JSON.createObjectNode();
    Map<String, Release> releases = releases(Json.object(releasingDoc, "releasing"), owners);
    Map<String, UnitState> units = new LinkedHashMap<>();
    for (Map.Entry<String, String> e : owners.entrySet()) {
      String unit = e.getKey();
      units.put(unit, new UnitState(e.getValue(), epochs.get(unit), releases.get(unit)));
    }
    int count = Json.intCount(doc.get("count"), "count");
    Lineage lineage = doc.has("lineage") ? lineage(Json.object(doc.get("lineage"), "lineage"), count) : null;
    return AssignmentTable.checked(
        set,
        Json.count(doc.get("generation"), "generation"),
        Json.string(doc.get("keyScheme"), "keyScheme"),
        count,
        Json.count(doc.get("epoch"), "epoch"),
        Json.string(doc.get("ackAnnotation"), "ackAnnotation"),
        members,
        units,
        lineage,
        seconds(doc.get("servingLease"), "servingLease"));
  }

  /** A number of seconds, or null when absent (a JSON null too, as the reference reader). */
  private static Double seconds(JsonNode value, String path) throws AssignmentFormatException {
    if (value == null || value.isNull()) {
      return null;
    }
    if (!value.isNumber()) {
      throw new AssignmentFormatException(path + ": expected a number of seconds, got " + value);
    }
    return value.asDouble();
  }

  private static void mapLayout(JsonNode doc, Map<String, String> owners, Map<String, Long> epochs)
      throws AssignmentFormatException {
    JsonNode units = Json.object(doc.get("units"), "units");
    JsonNode unitEpochs = Json.object(doc.get("unitEpochs"), "unitEpochs");
    Set<String> keys = new HashSet<>();
    unitEpochs.fieldNames().forEachRemaining(keys::add);
    Set<String> unitNames = new HashSet<>();
    units.fieldNames().forEachRemaining(unitNames::add);
    if (!keys.equals(unitNames)) {
      throw new AssignmentFormatException("unitEpochs must have exactly the keys of units");
    }
    for (Map.Entry<String, JsonNode> e : units.properties()) {
      String unit = e.getKey();
      JsonNode owner = e.getValue();
      owners.put(unit, owner.isNull() ? null : Json.string(owner, "units[" + unit + "]"));
      epochs.put(unit, Json.count(unitEpochs.get(unit), "unitEpochs[" + unit + "]"));
    }
  }

  private static void indexedLayout(
      JsonNode doc, List<Incarnation> members, Map<String, String> owners, Map<String, Long> epochs)
      throws AssignmentFormatException {
    JsonNode indexes = Json.array(doc.get("owners"), "owners");
    JsonNode unitEpochs = Json.array(doc.get("unitEpochs"), "unitEpochs");
    List<String> names = new ArrayList<>();
    if (doc.has("unitNames")) {
      for (JsonNode name : Json.array(doc.get("unitNames"), "unitNames")) {
        names.add(Json.string(name, "unitNames[]"));
      }
    } else {
      for (int i = 0; i < indexes.size(); i++) {
        names.add(Integer.toString(i));
      }
    }
    if (names.size() != indexes.size() || indexes.size() != unitEpochs.size()) {
      throw new AssignmentFormatException(
          "owners, unitEpochs (and unitNames) must have equal length");
    }
    if (new HashSet<>(names).size() != names.size()) {
      throw new AssignmentFormatException("unitNames: duplicate unit");
    }
    for (int i = 0; i < names.size(); i++) {
      String unit = names.get(i);
      JsonNode index = indexes.get(i);
      if (!index.isIntegralNumber()
          || !index.canConvertToInt()
          || index.asInt() < -1
          || index.asInt() >= members.size()) {
        throw new AssignmentFormatException(
            "owners[" + unit + "]: expected -1 or a member index below " + members.size());
      }
      owners.put(unit, index.asInt() < 0 ? null : members.get(index.asInt()).name());
      epochs.put(unit, Json.count(unitEpochs.get(i), "unitEpochs[]"));
    }
  }

  private static Map<String, Release> releases(JsonNode doc, Map<String, String> owners)
      throws AssignmentFormatException {
    Map<String, Release> releases = new HashMap<>();
    for (Map.Entry<String, JsonNode> e : doc.properties()) {
      String unit = e.getKey();
      String path = "releasing[" + unit + "]";
      JsonNode entry = Json.object(e.getValue(), path);
      JsonNode from = entry.get("from");
      String fromName = from == null || from.isNull() ? null : from.isTextual() ? from.asText() : "";
      if (!owners.containsKey(unit) || !java.util.Objects.equals(fromName, owners.get(unit))) {
        throw new AssignmentFormatException(path + ": 'from' must be the unit's owner");
      }
      JsonNode since = entry.get("since");
      if (since == null || !since.isNumber()) {
        throw new AssignmentFormatException(path + ".since: expected a number");
      }
      releases.put(
          unit,
          new Release(
              releaseTarget(entry, path + ".to"),
              since.asDouble(),
              Json.count(entry.get("epoch"), path + ".epoch")));
    }
    return releases;
  }

  /** A member's name, or null: to nobody (absent is an error, not a default). */
  private static String releaseTarget(JsonNode entry, String path)
      throws AssignmentFormatException {
    JsonNode to = entry.get("to");
    if (to == null) {
      throw new AssignmentFormatException(path + ": expected a member's name or null");
    }
    return to.isNull() ? null : Json.string(to, path);
  }

  private static Lineage lineage(JsonNode entry, int count) throws AssignmentFormatException {
    int fromCount = Json.intCount(entry.get("fromCount"), "lineage.fromCount");
    long epoch = Json.count(entry.get("epoch"), "lineage.epoch");
    List<Long> parents = new ArrayList<>();
    for (JsonNode e : Json.array(entry.get("parentEpochs"), "lineage.parentEpochs")) {
      parents.add(Json.count(e, "lineage.parentEpochs[]"));
    }
    int small = Math.min(fromCount, count);
    int big = Math.max(fromCount, count);
    if (small < 1 || big % small != 0 || small == big) {
      throw new AssignmentFormatException(
          "lineage: " + fromCount + " -> " + count + " is not a split or merge by an integer factor");
    }
    if (parents.size() != fromCount || parents.stream().anyMatch(p -> p >= epoch)) {
      throw new AssignmentFormatException(
          "lineage.parentEpochs: one token per previous unit, each below lineage.epoch");
    }
    return new Lineage(fromCount, count, epoch, parents);
  }

  private static JsonNode index(ConfigMapPayload root) throws AssignmentFormatException {
    JsonNode index;
    try {
      index = JSON.readTree(root.data().get(INDEX_KEY));
    } catch (IOException e) {
      throw new AssignmentFormatException(INDEX_KEY + " is not JSON: " + e.getMessage());
    }
    Json.object(index, INDEX_KEY);
    if (!API_VERSION.equals(index.path("apiVersion").asText(null))
        || !"AssignmentIndex".equals(index.path("kind").asText(null))) {
      throw new AssignmentFormatException(INDEX_KEY + ": unsupported index");
    }
    if (!"gzip".equals(index.path("encoding").asText(null))) {
      throw new AssignmentFormatException(
          INDEX_KEY + ": unsupported encoding " + index.get("encoding"));
    }
    int i = 0;
    for (JsonNode chunk : Json.array(index.get("chunks"), INDEX_KEY + ".chunks")) {
      String path = INDEX_KEY + ".chunks[" + i++ + "]";
      Json.object(chunk, path);
      Json.string(chunk.get("suffix"), path + ".suffix");
      Json.string(chunk.get("sha256"), path + ".sha256");
    }
    Json.string(index.get("sha256"), INDEX_KEY + ".sha256");
    return index;
  }

  private static byte[] joinChunks(JsonNode index, Map<String, ConfigMapPayload> bySuffix)
      throws AssignmentFormatException {
    ByteArrayOutputStream blob = new ByteArrayOutputStream();
    for (JsonNode chunk : index.get("chunks")) {
      String suffix = chunk.get("suffix").asText();
      ConfigMapPayload payload = bySuffix.get(suffix);
      if (payload == null || !payload.binaryData().containsKey(CHUNK_KEY)) {
        throw new IncompleteAssignmentException(
            "chunk " + suffix + " of epoch " + index.get("epoch") + " is missing");
      }
      byte[] part = unbase64(payload.binaryData().get(CHUNK_KEY), "chunk " + suffix);
      if (!sha256(part).equals(chunk.get("sha256").asText())) {
        throw new IncompleteAssignmentException("chunk " + suffix + " does not match its checksum");
      }
      blob.writeBytes(part);
    }
    byte[] joined = blob.toByteArray();
    if (!sha256(joined).equals(index.get("sha256").asText())) {
      throw new IncompleteAssignmentException("chunks do not add up to the indexed table");
    }
    return joined;
  }

  private static String sha256(byte[] data) {
    try {
      return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(data));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every Java platform has SHA-256", e);
    }
  }

  private static byte[] unbase64(String text, String what) throws AssignmentFormatException {
    try {
      return Base64.getDecoder().decode(text);
    } catch (IllegalArgumentException e) {
      throw new AssignmentFormatException(what + ": invalid base64: " + e.getMessage());
    }
  }

  private static byte[] gunzip(byte[] blob) throws AssignmentFormatException {
    try (InputStream in = new GZIPInputStream(new ByteArrayInputStream(blob))) {
      byte[] raw = in.readNBytes(MAX_DOCUMENT_BYTES);
      if (in.read() != -1) {
        throw new AssignmentFormatException(
            "assignment inflates beyond " + MAX_DOCUMENT_BYTES + " bytes");
      }
      return raw;
    } catch (ZipException e) {
      throw new AssignmentFormatException("assignment is not valid gzip: " + e.getMessage());
    } catch (IOException e) {
      // EOFException: the stream ends before the gzip trailer.
      throw new AssignmentFormatException("assignment gzip stream is truncated: " + e.getMessage());
    }
  }
}
