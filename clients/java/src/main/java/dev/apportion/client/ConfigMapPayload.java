package dev.apportion.client;

import java.util.Map;

/**
 * Contents of one ConfigMap of a table: named {@code <root name><suffix>}; the root has suffix
 * {@code ""}, chunks {@code "-<epoch>-<i>"}. {@code binaryData} values are base64, as in the API.
 */
public record ConfigMapPayload(String suffix, Map<String, String> data, Map<String, String> binaryData) {
  public ConfigMapPayload {
    data = data == null ? Map.of() : Map.copyOf(data);
    binaryData = binaryData == null ? Map.of() : Map.copyOf(binaryData);
  }

  /** The payload of ConfigMap {@code name}, part of the table whose root is {@code rootName}. */
  public static ConfigMapPayload of(
      String name, String rootName, Map<String, String> data, Map<String, String> binaryData)
      throws AssignmentFormatException {
    if (name == null || !name.startsWith(rootName)) {
      throw new AssignmentFormatException("ConfigMap " + name + " is not part of " + rootName);
    }
    return new ConfigMapPayload(name.substring(rootName.length()), data, binaryData);
  }
}
