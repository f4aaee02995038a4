package dev.apportion.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** The serving lease on a clock the test moves (tests/unit/test_worker_lease.py tests the Python one). */
class ServingLeaseTest {
  private double now = 1000;
  private final ServingLease lease = new ServingLease(() -> now);

  @Test
  void withoutALeaseNothingRunsOut() {
    assertTrue(lease.valid());
    assertTrue(lease.valid("3"));
    lease.releasing(Set.of("3"));
    now += 1e9;
    assertTrue(lease.valid("3"));
    assertEquals(Double.POSITIVE_INFINITY, lease.renewInterval());
    assertEquals(Double.POSITIVE_INFINITY, lease.remaining());
  }

  @Test
  void aLeaseNeverConfirmedHasRunOut() {
    lease.duration(20.0);
    assertFalse(lease.valid());
    assertFalse(lease.everConfirmed());
    assertEquals(0, lease.remaining());
    assertEquals(5, lease.renewInterval());
  }

  @Test
  void servingEndsALeaseAfterTheConfirmingRequestWasSent() {
    lease.duration(20.0);
    lease.confirm(now - 3); // sent 3 s ago, answered now
    assertTrue(lease.valid());
    assertEquals(1017, lease.expiresAt(), 1e-9);
    assertEquals(17, lease.remaining(), 1e-9);
    now += 16.9;
    assertTrue(lease.valid("0"));
    now += 0.1;
    assertFalse(lease.valid());
    assertFalse(lease.valid("0"));
    lease.confirm(now - 1);
    assertTrue(lease.valid("0"));
  }

  @Test
  void anOlderConfirmationArrivingLateChangesNothing() {
    lease.duration(20.0);
    lease.confirm(now);
    lease.confirm(now - 10);
    assertEquals(now + 20, lease.expiresAt(), 1e-9);
  }

  @Test
  void aReleasingUnitEndsALeaseAfterTheConfirmationBeforeItsTable() {
    lease.duration(20.0);
    lease.confirm(now); // c0 = 1000
    now += 4;
    lease.releasing(List.of("7")); // the table releasing 7 arrives, then is confirmed
    lease.confirm(now);
    now += 4;
    lease.confirm(now); // later confirmations keep the other units served...
    assertEquals(1020, lease.expiresAt("7"), 1e-9); // ...but do not extend the release
    assertEquals(1028, lease.expiresAt("1"), 1e-9);
    now = 1020;
    assertFalse(lease.valid("7"));
    assertTrue(lease.valid("1"));
    assertTrue(lease.valid());
  }

  @Test
  void aReleaseKeepsItsDeadlineInLaterTablesAndLosesItWhenItEnds() {
    lease.duration(20.0);
    lease.confirm(now);
    lease.releasing(List.of("7"));
    now += 10;
    lease.confirm(now);
    lease.releasing(List.of("7", "8")); // a newer table still releases 7, now also 8
    assertEquals(1020, lease.expiresAt("7"), 1e-9);
    assertEquals(1030, lease.expiresAt("8"), 1e-9);
    lease.releasing(List.of()); // the hand-off was cancelled: 7 is this worker's again
    lease.confirm(now);
    assertEquals(1030, lease.expiresAt("7"), 1e-9);
  }

  @Test
  void aUnitReleasedBeforeAnyConfirmationIsNotServed() {
    lease.duration(20.0);
    lease.releasing(List.of("7"));
    lease.confirm(now);
    assertTrue(lease.valid("1"));
    assertFalse(lease.valid("7"));
  }

  @Test
  void droppingTheLeaseEndsEveryBound() {
    lease.duration(20.0);
    lease.confirm(now);
    lease.releasing(List.of("7"));
    lease.duration(null); // whenCutOff changed to KeepServing
    now += 100;
    assertTrue(lease.valid("7"));
    assertEquals(Double.POSITIVE_INFINITY, lease.remaining("7"));
  }
}
