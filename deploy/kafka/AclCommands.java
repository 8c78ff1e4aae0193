import java.util.ArrayList;
import java.util.List;
import org.apache.kafka.common.utils.Exit;
import org.apache.kafka.tools.AclCommand;

/**
 * kafka-acls.sh once per group of arguments, the groups separated by an argument ";", in one
 * JVM (broker.sh kafka-acls): a JVM each costs ~2 s of CPU. Stops at the first command that
 * fails, with its exit code.
 */
public class AclCommands {
    /** AclCommand's exit, turned into a return to the next command. */
    static final class Exited extends RuntimeException {
        final int code;

        Exited(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    public static void main(String[] args) {
        Exit.setExitProcedure((code, message) -> {
            throw new Exited(code);
        });
        List<String> command = new ArrayList<>();
        for (int i = 0; i <= args.length; i++) {
            if (i < args.length && !args[i].equals(";")) {
                command.add(args[i]);
                continue;
            }
            try {
                AclCommand.main(command.toArray(new String[0]));
            } catch (Exited e) {
                if (e.code != 0) {
                    System.exit(e.code);
                }
            }
            command.clear();
        }
        System.exit(0);
    }
}
