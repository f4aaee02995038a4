package dev.apportion.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.util.Map;
import java.util.Set;
import org.junit.jupiter.api.Test;

/** The ack annotation's optional {@code failing} field, as tests/unit/test_assignment_format.py
 * checks it for the Python codec. */
class AckTest {
  @Test
  void failingIsWrittenOnlyWhenSomethingFailsAndReadBack() throws AssignmentFormatException {
    Ack plain = new Ack("u-1", 12, Set.of("9", "10"), true);
    assertFalse(plain.toAnnotation().contains("failing")); // older readers see no change
    assertEquals(plain, Ack.fromAnnotation(plain.toAnnotation()));
    Ack failing =
        new Ack("u-1", 12, Set.of("9", "10"), false, Map.of("10", "IOException: full", "9", "x"));
    assertEquals(
        "{\"uid\":\"u-1\",\"epoch\":12,\"pending\":[\"9\",\"10\"],\"draining\":false,"
            + "\"failing\":{\"9\":\"x\",\"10\":\"IOException: full\"}}",
        failing.toAnnotation());
    assertEquals(failing, Ack.fromAnnotation(failing.toAnnotation()));
    Ack old = Ack.fromAnnotation("{\"uid\":\"u\",\"epoch\":0}"); // before failing existed
    assertEquals(new Ack("u", 0, Set.of(), false), old);
  }

  @Test
  void failingMustMapUnitsToMessages() {
    for (String bad : new String[] {
        "{\"uid\":\"u\",\"epoch\":1,\"failing\":[\"0\"]}",
        "{\"uid\":\"u\",\"epoch\":1,\"failing\":{\"0\":1}}"}) {
      assertThrows(AssignmentFormatException.class, () -> Ack.fromAnnotation(bad), bad);
    }
  }

  @Test
  void failingMessagesAreCutForThePodsAnnotationBudget() {
    WorkerState state = new WorkerState(new Incarnation("w0", "uid-0"), "PartitionSet", "ns", "s");
    assertEquals(Map.of(), state.failing());
    state.releaseFailed(Set.of("1"), "x".repeat(500));
    assertEquals(WorkerState.FAILING_MESSAGE_LIMIT, state.failing().get("1").length());
  }
}
