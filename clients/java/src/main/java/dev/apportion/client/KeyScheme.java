package dev.apportion.client;

import java.nio.charset.StandardCharsets;
import net.openhft.hashing.LongHashFunction;

/**
 * Which unit (partition, shard) a key belongs to: the three schemes of the Python
 * apportion.engine.keys, bit for bit (conformance/keys/ checks both).
 */
public enum KeyScheme {
  /**
   * Netherite's partition function: a key whose text after its last {@code !} is an unsigned
   * 32-bit decimal {@code n} goes to {@code n mod count}; any other to {@code FNV-1a-32(UTF-8) mod
   * count}.
   */
  NETHERITE("netherite") {
    @Override
    public int unit(String key, int count) {
      checkCount(count);
      long n = suffixIndex(key);
      return (int) ((n >= 0 ? n : fnv1a32(utf8(key))) % count);
    }
  },
  /** Akka's (and Pekko's) default shard extractor: {@code abs(key.hashCode() % count)}. */
  AKKA("akka") {
    @Override
    public int unit(String key, int count) {
      checkCount(count);
      return Math.abs(key.hashCode() % count);
    }
  },
  /**
   * xxh3-64 of the UTF-8 bytes reduced by multiply-shift {@code (h * count) >>> 64} (unsigned),
   * so unit {@code u} of {@code n} holds the hashes {@code [u*2^64/n, (u+1)*2^64/n)}; the {@code
   * !n} suffix pins a key to {@code n mod count}.
   */
  APPORTION("apportion") {
    @Override
    public int unit(String key, int count) {
      checkCount(count);
      long n = suffixIndex(key);
      if (n >= 0) {
        return (int) (n % count);
      }
      return (int) multiplyShift(xxh3(key), count);
    }
  };

  private static final LongHashFunction XXH3 = LongHashFunction.xx3();
  private static final long UINT32_MAX = 0xFFFF_FFFFL;

  private final String schemeName;

  KeyScheme(String schemeName) {
    this.schemeName = schemeName;
  }

  /** The unit of {@code key} among {@code count} units (0-based). */
  public abstract int unit(String key, int count);

  /** The name tables use in {@code keyScheme}. */
  public String schemeName() {
    return schemeName;
  }

  /** The scheme a table names ({@code netherite}, {@code akka} or {@code apportion}). */
  public static KeyScheme named(String name) {
    for (KeyScheme scheme : values()) {
      if (scheme.schemeName.equals(name)) {
        return scheme;
      }
    }
    throw new IllegalArgumentException("unknown key scheme " + name);
  }

  private static void checkCount(int count) {
    if (count < 1) {
      throw new IllegalArgumentException("count must be between 1 and 2147483647, got " + count);
    }
  }

  /** The {@code n} of a key ending in {@code !n} (ASCII digits, at most 2^32-1), else -1. */
  static long suffixIndex(String key) {
    int bang = key.lastIndexOf('!');
    if (bang < 0 || bang == key.length() - 1) {
      return -1;
    }
    int start = bang + 1;
    for (int i = start; i < key.length(); i++) {
      char c = key.charAt(i);
      if (c < '0' || c > '9') {
        return -1;
      }
    }
    while (start < key.length() - 1 && key.charAt(start) == '0') {
      start++;
    }
    if (key.length() - start > 10) {
      return -1;
    }
    long value = Long.parseLong(key.substring(start));
    return value <= UINT32_MAX ? value : -1;
  }

  /** UTF-8 with unpaired surrogates replaced by U+FFFD, as .NET's Encoding.UTF8 and Python do
   * (Java's own encoder would write '?'). */
  static byte[] utf8(String key) {
    StringBuilder repaired = null;
    for (int i = 0; i < key.length(); i++) {
      char c = key.charAt(i);
      boolean paired =
          Character.isHighSurrogate(c)
              ? i + 1 < key.length() && Character.isLowSurrogate(key.charAt(i + 1))
              : !Character.isLowSurrogate(c);
      if (Character.isHighSurrogate(c) && paired) {
        if (repaired != null) {
          repaired.append(c).append(key.charAt(i + 1));
        }
        i++;
        continue;
      }
      if (!paired && repaired == null) {
        repaired = new StringBuilder(key.length()).append(key, 0, i);
      }
      if (repaired != null) {
        repaired.append(paired ? c : '\uFFFD');
      }
    }
    return (repaired == null ? key : repaired.toString()).getBytes(StandardCharsets.UTF_8);
  }

  static long fnv1a32(byte[] data) {
    int h = 0x811C9DC5;
    for (byte b : data) {
      h = (h ^ (b & 0xFF)) * 0x01000193;
    }
    return h & UINT32_MAX;
  }

  static long xxh3(String key) {
    return XXH3.hashBytes(utf8(key));
  }

  /** The high 64 bits of the unsigned 128-bit product of {@code hash} and {@code count}. */
  static long multiplyShift(long hash, int count) {
    long high = Math.multiplyHigh(hash, count);
    return hash < 0 ? high + count : high;
  }
}
