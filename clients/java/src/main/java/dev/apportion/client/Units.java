package dev.apportion.client;

import java.util.Comparator;

/** Unit names: decimal numbers in numeric order, then any other name lexicographically. */
final class Units {
  private Units() {}

  static boolean isNumber(String unit) {
    if (unit.isEmpty() || (unit.length() > 1 && unit.charAt(0) == '0')) {
      return false;
    }
    for (int i = 0; i < unit.length(); i++) {
      char c = unit.charAt(i);
      if (c < '0' || c > '9') {
        return false;
      }
    }
    return true;
  }

  /** The canonical unit order of apportion.api.assignment.unit_order. */
  static final Comparator<String> ORDER =
      (a, b) -> {
        boolean na = isNumber(a);
        boolean nb = isNumber(b);
        if (na && nb) {
          // Equal-length decimal strings without leading zeros compare as their numbers.
          return a.length() != b.length() ? Integer.compare(a.length(), b.length()) : a.compareTo(b);
        }
        if (na != nb) {
          return na ? -1 : 1;
        }
        return a.compareTo(b);
      };
}
