package dev.apportion.client;

import com.fasterxml.jackson.databind.JsonNode;

/** Field checks shared by the table, index and ack readers; errors name the field. */
final class Json {
  private Json() {}

  static JsonNode object(JsonNode value, String path) throws AssignmentFormatException {
    if (value == null || !value.isObject()) {
      throw new AssignmentFormatException(path + ": expected an object");
    }
    return value;
  }

  static JsonNode array(JsonNode value, String path) throws AssignmentFormatException {
    if (value == null || !value.isArray()) {
      throw new AssignmentFormatException(path + ": expected an array");
    }
    return value;
  }

  static String string(JsonNode value, String path) throws AssignmentFormatException {
    if (value == null || !value.isTextual() || value.asText().isEmpty()) {
      throw new AssignmentFormatException(path + ": expected a non-empty string");
    }
    return value.asText();
  }

  /** A non-negative integer: 9.0 and true are not integers. */
  static long count(JsonNode value, String path) throws AssignmentFormatException {
    if (value == null || !value.isIntegralNumber() || !value.canConvertToLong() || value.asLong() < 0) {
      throw new AssignmentFormatException(
          path + ": expected a non-negative integer, got " + value);
    }
    return value.asLong();
  }

  static int intCount(JsonNode value, String path) throws AssignmentFormatException {
    long n = count(value, path);
    if (n > Integer.MAX_VALUE) {
      throw new AssignmentFormatException(path + ": " + n + " is too large");
    }
    return (int) n;
  }
}
