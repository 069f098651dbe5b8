// One long-lived JVM that runs Kafka tool main classes on request, so a test pays a JVM start
// once per Kafka release and test worker instead of once per tool run (tests/harness/tool_runner.py
// is its client; docs/testbed.md, "Tools").
//
// Requests and answers are frames on the JVM's own stdin and stdout (the tools get captured
// streams of their own):
//   request: int32 n, then n strings (int32 length + UTF-8): main class, stdin text, args...
//   answer:  int32 exit status, int32 length + stdout bytes, int32 length + stderr bytes, int32
//            threads the run left alive (the client starts a fresh runner when there are any)
// A run ends as the process would: when main returns (after the non-daemon threads it started),
// or when it calls System.exit / Runtime.halt / Kafka's Exit, whose status is the answer's; what
// the tool prints after asking to exit is dropped, and the shutdown hooks it registered run then,
// as they would at a real exit. An exception out of main is printed and answers 1, as the JVM does.
import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.security.Permission;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

public final class ToolRunner {
    /** Thrown in the thread that asked to exit; unwinds the tool. */
    static final class ExitRequest extends Error {
        final int status;

        ExitRequest(int status) {
            super("exit " + status, null, false, false);
            this.status = status;
        }
    }

    /** Capture of one run's stream; closed to writes once the tool asked to exit. */
    static final class Gate extends OutputStream {
        final ByteArrayOutputStream buf = new ByteArrayOutputStream();
        volatile boolean open = true;

        @Override
        public synchronized void write(int b) {
            if (open) buf.write(b);
        }

        @Override
        public synchronized void write(byte[] b, int off, int len) {
            if (open) buf.write(b, off, len);
        }

        synchronized byte[] take() {
            open = false;
            return buf.toByteArray();
        }
    }

    static volatile Integer exitStatus; // the first exit asked for in the current run
    static volatile Gate out, err;

    static void requestExit(int status) {
        synchronized (ToolRunner.class) {
            if (exitStatus == null) {
                exitStatus = status;
                if (out != null) out.open = false;
                if (err != null) err.open = false;
            }
        }
        throw new ExitRequest(status);
    }

    public static void main(String[] argv) throws Exception {
        DataInputStream in = new DataInputStream(System.in);
        DataOutputStream reply = new DataOutputStream(new java.io.BufferedOutputStream(
                new java.io.FileOutputStream(java.io.FileDescriptor.out)));
        installExitTraps();
        // Anything printed outside a run goes to the runner's stderr, never into the frames.
        System.setOut(new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.err), true));
        reply.writeInt(0x4b4d5452); // "KMTR": ready
        reply.flush();
        while (true) {
            List<String> req;
            try {
                req = readRequest(in);
            } catch (EOFException e) {
                return;
            }
            Result r = run(req.get(0), req.get(1), req.subList(2, req.size()).toArray(new String[0]));
            reply.writeInt(r.status);
            reply.writeInt(r.out.length);
            reply.write(r.out);
            reply.writeInt(r.err.length);
            reply.write(r.err);
            reply.writeInt(r.leaked);
            reply.flush();
        }
    }

    static List<String> readRequest(DataInputStream in) throws IOException {
        int n = in.readInt();
        List<String> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            byte[] b = new byte[in.readInt()];
            in.readFully(b);
            out.add(new String(b, StandardCharsets.UTF_8));
        }
        return out;
    }

    static final class Result {
        int status, leaked;
        byte[] out, err;
    }

    static Result run(String mainClass, String stdin, String[] args) {
        PrintStream origOut = System.out, origErr = System.err;
        InputStream origIn = System.in;
        Set<Thread> before = liveThreads();
        Map<Thread, Thread> hooksBefore = shutdownHooks();
        Gate o = new Gate(), e = new Gate();
        PrintStream po = new PrintStream(o, true, StandardCharsets.UTF_8);
        PrintStream pe = new PrintStream(e, true, StandardCharsets.UTF_8);
        synchronized (ToolRunner.class) {
            exitStatus = null;
            out = o;
            err = e;
        }
        System.setIn(new ByteArrayInputStream(stdin.getBytes(StandardCharsets.UTF_8)));
        System.setOut(po);
        System.setErr(pe);
        int status = 0;
        Thread main = new Thread(() -> invoke(mainClass, args, po, pe), "main");
        main.start();
        try {
            main.join();
            if (exitStatus == null) {
                // The JVM would wait for the tool's non-daemon threads before exiting.
                for (Thread t : liveThreads()) {
                    if (!before.contains(t) && !t.isDaemon() && t != Thread.currentThread()) {
                        t.join();
                        if (exitStatus != null) break;
                    }
                }
            }
            Integer s = exitStatus;
            status = s != null ? s : mainFailed ? 1 : 0;
            runNewShutdownHooks(hooksBefore);
        } catch (InterruptedException ie) {
            status = 1;
        } finally {
            po.flush();
            pe.flush();
            System.setIn(origIn);
            System.setOut(origOut);
            System.setErr(origErr);
            synchronized (ToolRunner.class) {
                out = null;
                err = null;
            }
        }
        Result r = new Result();
        r.status = status;
        r.out = o.take();
        r.err = e.take();
        for (Thread t : liveThreads()) {
            if (!before.contains(t) && t.isAlive()) r.leaked++;
        }
        mainFailed = false;
        return r;
    }

    static volatile boolean mainFailed;

    static void invoke(String mainClass, String[] args, PrintStream out, PrintStream err) {
        scalaConsole(out, err);
        try {
            Method m = Class.forName(mainClass).getMethod("main", String[].class);
            m.invoke(null, (Object) args);
        } catch (InvocationTargetException ite) {
            Throwable t = ite.getCause();
            if (t instanceof ExitRequest) return;
            mainFailed = true;
            err.print("Exception in thread \"main\" ");
            t.printStackTrace(err);
        } catch (ExitRequest x) {
            // exit asked for
        } catch (ReflectiveOperationException | LinkageError ex) {
            mainFailed = true;
            err.println("Error: Could not find or load main class " + mainClass);
            err.println("Caused by: " + ex);
        }
    }

    /** The Scala tools print through scala.Console, whose streams are its own (inherited by the
     * threads this one starts), not System.out's. */
    static void scalaConsole(PrintStream out, PrintStream err) {
        try {
            Class<?> c = Class.forName("scala.Console$");
            Object console = c.getField("MODULE$").get(null);
            for (String[] f : new String[][] {{"outVar", "o"}, {"errVar", "e"}}) {
                Field v = c.getDeclaredField(f[0]);
                v.setAccessible(true);
                Object dyn = v.get(console);
                dyn.getClass().getMethod("value_$eq", Object.class)
                        .invoke(dyn, f[1].equals("o") ? out : err);
            }
        } catch (ReflectiveOperationException | RuntimeException ex) {
            // no Scala on the classpath, or another Console: nothing to redirect
        }
    }

    static Set<Thread> liveThreads() {
        return new HashSet<>(Thread.getAllStackTraces().keySet());
    }

    @SuppressWarnings("unchecked")
    static Map<Thread, Thread> hooksMap() {
        try {
            Class<?> c = Class.forName("java.lang.ApplicationShutdownHooks");
            Field f = c.getDeclaredField("hooks");
            f.setAccessible(true);
            return (Map<Thread, Thread>) f.get(null);
        } catch (ReflectiveOperationException | RuntimeException ex) {
            return null;
        }
    }

    static Map<Thread, Thread> shutdownHooks() {
        Map<Thread, Thread> m = hooksMap();
        if (m == null) return new IdentityHashMap<>();
        try {
            // ApplicationShutdownHooks guards its map with the class's lock.
            synchronized (Class.forName("java.lang.ApplicationShutdownHooks")) {
                return new IdentityHashMap<>(m);
            }
        } catch (ClassNotFoundException ex) {
            return new IdentityHashMap<>();
        }
    }

    /** The hooks the run registered, run and removed as an exit would. */
    static void runNewShutdownHooks(Map<Thread, Thread> before) throws InterruptedException {
        Map<Thread, Thread> now = shutdownHooks();
        for (Thread h : now.keySet()) {
            if (before.containsKey(h)) continue;
            try {
                Runtime.getRuntime().removeShutdownHook(h);
            } catch (IllegalStateException | IllegalArgumentException ex) {
                continue;
            }
            h.start();
            h.join(30_000);
        }
    }

    @SuppressWarnings("removal")
    static void installExitTraps() {
        // Kafka's tools exit through org.apache.kafka.common.utils.Exit (the Scala tools' too).
        try {
            Class<?> exit = Class.forName("org.apache.kafka.common.utils.Exit");
            Class<?> proc = Class.forName("org.apache.kafka.common.utils.Exit$Procedure");
            Object p = java.lang.reflect.Proxy.newProxyInstance(
                    ToolRunner.class.getClassLoader(), new Class<?>[] {proc},
                    (self, method, a) -> {
                        if (method.getDeclaringClass() == Object.class) {
                            return method.invoke(ToolRunner.class, a);
                        }
                        requestExit((Integer) a[0]);
                        return null;
                    });
            exit.getMethod("setExitProcedure", proc).invoke(null, p);
            exit.getMethod("setHaltProcedure", proc).invoke(null, p);
        } catch (ReflectiveOperationException ex) {
            System.err.println("ToolRunner: Kafka's Exit not found: " + ex);
        }
        // And everything else that calls System.exit or Runtime.halt.
        System.setSecurityManager(new SecurityManager() {
            @Override
            public void checkPermission(Permission perm) {}

            @Override
            public void checkPermission(Permission perm, Object context) {}

            @Override
            public void checkExit(int status) {
                requestExit(status);
            }
        });
    }
}
