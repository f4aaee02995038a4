package dev.apportion.client;

/** One incarnation of a worker pod: a StatefulSet pod keeps its name, never its uid. */
public record Incarnation(String name, String uid) {}
