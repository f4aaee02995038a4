package dev.apportion.client;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.HexFormat;
import java.util.Locale;

/** The names a worker derives from its set (docs/assignment-format.md, conformance/names.json). */
public final class Names {
  /** ConfigMap names are DNS subdomains (253); chunk ConfigMaps append "-<epoch>-<i>". */
  private static final int CONFIG_MAP_NAME_MAX = 253 - 32;
  /** The name part of an annotation key. */
  private static final int ANNOTATION_NAME_MAX = 63;

  private Names() {}

  /** The root ConfigMap of a set's table: {@code <name>-<kind>-assignment}, lower case; too long
   * a name is cut and ends in a digest, so two sets never share one. */
  public static String assignmentConfigMap(String kind, String name) {
    String full = name + "-" + kind.toLowerCase(Locale.ROOT) + "-assignment";
    if (full.length() <= CONFIG_MAP_NAME_MAX) {
      return full;
    }
    String digest = sha256(full).substring(0, 10);
    String head = full.substring(0, CONFIG_MAP_NAME_MAX - digest.length() - 1).replaceAll("[-.]+$", "");
    return head + "-" + digest;
  }

  /** The Pod annotation through which a worker acknowledges releases for one set. */
  public static String ackAnnotation(String kind, String name) {
    String local = "ack." + kind.toLowerCase(Locale.ROOT) + "." + name;
    if (local.length() > ANNOTATION_NAME_MAX) {
      String digest = sha256(local).substring(0, 10);
      local = local.substring(0, ANNOTATION_NAME_MAX - digest.length() - 1) + "-" + digest;
    }
    return "apportion.dev/" + local;
  }

  private static String sha256(String text) {
    try {
      return HexFormat.of()
          .formatHex(MessageDigest.getInstance("SHA-256").digest(text.getBytes(StandardCharsets.UTF_8)));
    } catch (NoSuchAlgorithmException e) {
      throw new IllegalStateException("every Java platform has SHA-256", e);
    }
  }
}
