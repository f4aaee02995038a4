package dev.apportion.client;

import java.math.BigInteger;

/**
 * Unit {@code unit} of {@code count} and the 64-bit key hashes {@code [lo, hi)} it holds under
 * the apportion key scheme: {@code (xxh3(key) * count) >>> 64 == unit} exactly when {@code lo <=
 * hash < hi} (hashes as unsigned numbers, hence BigInteger: {@code hi} may be 2^64).
 */
public record UnitRange(String unit, int count, BigInteger lo, BigInteger hi) {
  private static final int HASH_BITS = 64;

  /** The range of a decimal unit name among {@code count} units: [⌈u·2⁶⁴/n⌉, ⌈(u+1)·2⁶⁴/n⌉). */
  public static UnitRange of(String unit, int count) {
    int u = Integer.parseInt(unit);
    if (u < 0 || u >= count) {
      throw new IllegalArgumentException("unit " + unit + " is not in 0.." + (count - 1));
    }
    return new UnitRange(unit, count, ceilShifted(u, count), ceilShifted(u + 1L, count));
  }

  private static BigInteger ceilShifted(long unit, int count) {
    BigInteger n = BigInteger.valueOf(count);
    return BigInteger.valueOf(unit).shiftLeft(HASH_BITS).add(n).subtract(BigInteger.ONE).divide(n);
  }
}
