package dev.apportion.client;

/**
 * A hand-off in progress: the owner must stop serving the unit and acknowledge.
 *
 * @param to the future owner; null: nobody, the unit then waits unowned for the owner's next
 *     incarnation (a StatefulSet pod leaving under {@code restartGrace})
 * @param since operator clock (Unix seconds) when the release was first published
 * @param epoch table epoch that first published this release; older acks do not count
 */
public record Release(String to, double since, long epoch) {}
